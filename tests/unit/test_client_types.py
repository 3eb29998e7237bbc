"""specdec.client without a server: wire messages -> results and back, the request the
options build (its defaults are the server's), and gRPC statuses -> error classes."""

from __future__ import annotations

import dataclasses
import json

import grpc
import grpc.aio
import pytest

from specdec import client, wire
from specdec.client.convert import (
    chunk_from_proto,
    chunk_to_proto,
    completion_from_proto,
    completion_to_proto,
    kind_from_proto,
    stats_from_proto,
)
from specdec.client.errors import error_for, from_rpc_error
from specdec.client.types import TokenKind
from specdec.sampling import SamplingParams
from specdec.v1 import generate_pb2

STATS = generate_pb2.GenerationStats(
    prompt_tokens=5, generated_tokens=9, rounds=3, drafted_tokens=8, accepted_tokens=6,
    seconds=0.25, pipelined_rounds=2, predrafts_wasted=1, k_per_round=[4, 2, 2],
    confidence_exits=1)
KINDS = [generate_pb2.TOKEN_KIND_ACCEPTED, generate_pb2.TOKEN_KIND_RECOVERED,
         generate_pb2.TOKEN_KIND_BONUS, generate_pb2.TOKEN_KIND_TARGET]


def chunk(**kw) -> generate_pb2.GenerateChunk:
    kw = dict(dict(text="ab c", token_ids=[1, 2, 3, 4], kinds=KINDS,
                   token_texts=["a", "b", "", " c"]), **kw)
    return generate_pb2.GenerateChunk(**kw)


# -- results ---------------------------------------------------------------------------


def test_token_kinds_are_the_proto_enum():
    assert [kind_from_proto(k) for k in KINDS] == [TokenKind.ACCEPTED, TokenKind.RECOVERED,
                                                   TokenKind.BONUS, TokenKind.TARGET]
    assert {k.name for k in TokenKind} == {
        n.removeprefix("TOKEN_KIND_") for n in generate_pb2.TokenKind.keys()} - {"UNSPECIFIED"}
    assert str(TokenKind.BONUS) == "bonus"
    with pytest.raises(ValueError, match="unknown token kind 0"):
        kind_from_proto(generate_pb2.TOKEN_KIND_UNSPECIFIED)


def test_stats_keep_every_field_and_derive_rates():
    stats = stats_from_proto(STATS)
    names = {f.name for f in dataclasses.fields(stats)}
    assert names == set(generate_pb2.GenerationStats.DESCRIPTOR.fields_by_name)
    assert (stats.prompt_tokens, stats.generated_tokens, stats.rounds) == (5, 9, 3)
    assert (stats.drafted_tokens, stats.accepted_tokens, stats.seconds) == (8, 6, 0.25)
    assert (stats.pipelined_rounds, stats.predrafts_wasted, stats.confidence_exits) == (2, 1, 1)
    assert stats.k_per_round == (4, 2, 2)
    assert stats.acceptance_rate == 0.75 and stats.tokens_per_round == 3.0
    none = stats_from_proto(generate_pb2.GenerationStats(generated_tokens=4, rounds=4))
    assert none.acceptance_rate is None and none.tokens_per_round == 1.0
    assert stats_from_proto(generate_pb2.GenerationStats()).tokens_per_round is None


def test_a_middle_chunk_has_no_reason_and_no_stats():
    c = chunk_from_proto(chunk())
    assert (c.text, c.token_ids, c.token_texts) == ("ab c", (1, 2, 3, 4), ("a", "b", "", " c"))
    assert c.kinds == (TokenKind.ACCEPTED, TokenKind.RECOVERED, TokenKind.BONUS,
                       TokenKind.TARGET)
    assert c.finish_reason is None and c.stats is None


def test_the_last_chunk_brings_reason_and_stats():
    c = chunk_from_proto(chunk(finish_reason="eos", stats=STATS))
    assert c.finish_reason == "eos" and c.stats == stats_from_proto(STATS)
    empty = generate_pb2.GenerateChunk(finish_reason="length")
    empty.stats.SetInParent()  # present, every field zero
    assert chunk_from_proto(empty).stats is not None


def test_completion():
    resp = generate_pb2.GenerateResponse(text="hi", token_ids=[7, 8], kinds=KINDS[2:],
                                         finish_reason="stop", stats=STATS,
                                         token_texts=["h", "i"])
    done = completion_from_proto(resp)
    assert (done.text, done.token_ids, done.token_texts) == ("hi", (7, 8), ("h", "i"))
    assert done.kinds == (TokenKind.BONUS, TokenKind.TARGET)
    assert done.finish_reason == "stop" and done.stats.k_per_round == (4, 2, 2)


@pytest.mark.parametrize("message", [
    chunk(), chunk(finish_reason="length", stats=STATS), generate_pb2.GenerateChunk(),
    generate_pb2.GenerateChunk(finish_reason="eos", stats=generate_pb2.GenerationStats()),
], ids=["middle", "last", "empty", "last-zero-stats"])
def test_a_chunk_goes_back_to_the_same_message(message):
    assert chunk_to_proto(chunk_from_proto(message)) == message
    assert chunk_to_proto(chunk_from_proto(message)).HasField("stats") == \
        message.HasField("stats")


def test_a_completion_goes_back_to_the_same_message():
    resp = generate_pb2.GenerateResponse(text="ab c", token_ids=[1, 2, 3, 4], kinds=KINDS,
                                         finish_reason="length", stats=STATS,
                                         token_texts=["a", "b", "", " c"])
    assert completion_to_proto(completion_from_proto(resp)) == resp


def test_log_probabilities_go_back_to_the_same_message():
    entry = generate_pb2.GenerateChunk(token_ids=[7], kinds=KINDS[:1], token_texts=["x"])
    entry.logprobs.add(token_ids=[7], logprobs=[-0.5], top_ids=[7, 3],
                       top_logprobs=[-0.5, -1.25])
    entry.prompt_token_ids.extend([1, 2])
    entry.prompt_logprobs.add(token_ids=[2], logprobs=[-3.0])
    chunk = chunk_from_proto(entry)
    assert chunk.logprobs[0].top_ids == (7, 3) and chunk.prompt_token_ids == (1, 2)
    assert chunk_to_proto(chunk) == entry


def test_the_client_needs_no_torch():
    import subprocess
    import sys

    code = "import sys, specdec.client; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_results_are_frozen():
    done = completion_from_proto(generate_pb2.GenerateResponse(stats=STATS))
    with pytest.raises(dataclasses.FrozenInstanceError):
        done.text = "x"
    with pytest.raises(dataclasses.FrozenInstanceError):
        done.stats.rounds = 0


# -- the request -----------------------------------------------------------------------


def test_unset_options_are_the_servers_defaults():
    request = client.build_request("hi")
    assert request.prompt == "hi" and not request.messages and not request.prompt_token_ids
    assert wire.sampling_from_proto(request.sampling) == SamplingParams()
    assert not request.HasField("num_draft_tokens")  # the coordinator picks K
    assert list(request.stop) == [] and request.max_new_tokens == client.DEFAULT_MAX_NEW_TOKENS


def test_options_reach_the_request():
    request = client.build_request(prompt_token_ids=[3, 4], max_new_tokens=9, temperature=0.7,
                                   top_p=0.9, top_k=40, seed=2**63, stop=["\n", "END"],
                                   num_draft_tokens=0)
    assert list(request.prompt_token_ids) == [3, 4] and request.max_new_tokens == 9
    assert wire.sampling_from_proto(request.sampling) == SamplingParams(
        pytest.approx(0.7), 40, pytest.approx(0.9), 2**63)
    assert request.HasField("num_draft_tokens") and request.num_draft_tokens == 0
    assert list(request.stop) == ["\n", "END"]
    assert list(client.build_request("x", stop="END").stop) == ["END"]  # not 3 letters


def test_sampling_parameters_and_logprobs_reach_the_request():
    request = client.build_request("x", presence_penalty=0.5, frequency_penalty=-1.0,
                                   repetition_penalty=1.25, min_p=0.125,
                                   logit_bias={3: -100.0}, logprobs=4, prompt_logprobs=True,
                                   max_new_tokens=0)
    assert wire.sampling_from_proto(request.sampling) == SamplingParams(
        presence_penalty=0.5, frequency_penalty=-1.0, repetition_penalty=1.25, min_p=0.125,
        logit_bias=((3, -100.0),))
    assert request.logprobs == 4 and request.prompt_logprobs
    assert not client.build_request("x").HasField("logprobs")
    assert client.build_request("x", prediction="the text").prediction == "the text"


def test_structured_output_reaches_the_request_as_the_services_read_it():
    from specdec.grammar import Grammar

    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    cases = {"json": (schema, Grammar.of("json_schema", json.dumps(schema))),
             "json_object": (True, Grammar.of("json_object")),
             "regex": ("[a-z]+", Grammar.of("regex", "[a-z]+")),
             "choice": (["yes", "no"], Grammar.of("choice", '["yes", "no"]')),
             "grammar": ('start: "x"', Grammar.of("lark", 'start: "x"'))}
    for key, (value, grammar) in cases.items():
        request = client.build_request("x", structured_output={key: value})
        assert wire.sampling_from_proto(request.sampling).grammar == grammar, key
    for bad in ({}, {"json": schema, "regex": "a"}, {"yaml": "a: 1"}, {"regex": 5},
                {"json_object": False}):
        with pytest.raises(ValueError, match="structured_output"):
            client.build_request("x", structured_output=bad)


def test_every_build_request_option_is_a_typed_option():
    import inspect

    from specdec.client.request import GenerateOptions

    options = set(inspect.signature(client.build_request).parameters) - {"prompt"}
    assert options == set(GenerateOptions.__annotations__)


def test_messages_as_dicts_or_tuples():
    want = [generate_pb2.ChatMessage(role="system", content="Be brief."),
            generate_pb2.ChatMessage(role="user", content="Hi")]
    for messages in ([{"role": "system", "content": "Be brief."}, ("user", "Hi")],
                     (m for m in [("system", "Be brief."), {"role": "user", "content": "Hi"}])):
        assert list(client.build_request(messages=messages).messages) == want
    with pytest.raises(TypeError, match="chat message"):
        client.build_request(messages=["Hi"])


def test_the_request_is_not_checked_here():
    """Both prompt and messages go out as given: the server says what is wrong."""
    request = client.build_request("x", messages=[("user", "y")], max_new_tokens=0)
    assert request.prompt == "x" and len(request.messages) == 1 and request.max_new_tokens == 0


# -- errors ----------------------------------------------------------------------------

ERRORS = {
    grpc.StatusCode.INVALID_ARGUMENT: client.InvalidArgumentError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: client.ResourceExhaustedError,
    grpc.StatusCode.UNAVAILABLE: client.UnavailableError,
    grpc.StatusCode.DEADLINE_EXCEEDED: client.DeadlineExceededError,
    grpc.StatusCode.NOT_FOUND: client.NotFoundError,
    grpc.StatusCode.FAILED_PRECONDITION: client.FailedPreconditionError,
    grpc.StatusCode.CANCELLED: client.RequestCancelledError,
    grpc.StatusCode.INTERNAL: client.InternalError,
}


@pytest.mark.parametrize("code", list(ERRORS), ids=lambda c: c.name)
def test_each_common_status_has_its_class(code):
    err = error_for(code, "the server's words")
    assert type(err) is ERRORS[code] and isinstance(err, client.SpecdecAPIError)
    assert (err.code, err.status_name, err.message) == (code, code.name, "the server's words")
    assert str(err) == f"{code.name}: the server's words"


def test_other_statuses_are_the_base_class():
    err = error_for(grpc.StatusCode.ABORTED, "busy")
    assert type(err) is client.SpecdecAPIError and err.status_name == "ABORTED"


def test_a_grpc_error_keeps_the_servers_message():
    rpc = grpc.aio.AioRpcError(grpc.StatusCode.INVALID_ARGUMENT, grpc.aio.Metadata(),
                               grpc.aio.Metadata(), details="max_new_tokens must be in [1, 4]")
    err = from_rpc_error(rpc)
    assert isinstance(err, client.InvalidArgumentError)
    assert err.message == "max_new_tokens must be in [1, 4]"
    no_details = from_rpc_error(grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE,
                                                     grpc.aio.Metadata(), grpc.aio.Metadata()))
    assert isinstance(no_details, client.UnavailableError) and no_details.message == ""
    bare = from_rpc_error(grpc.RpcError())
    assert type(bare) is client.SpecdecAPIError and bare.code == grpc.StatusCode.UNKNOWN


def test_request_cancelled_is_not_asyncio_cancelled():
    import asyncio

    assert not issubclass(client.RequestCancelledError, asyncio.CancelledError)
    assert issubclass(client.RequestCancelledError, Exception)


def test_one_stats_schema_the_wire_s():
    """GenerationStats is the schema: the client's Stats has every field of it, the loop's
    LoopStats every one the service does not fill itself, and the conversions derived
    from it carry every field both ways."""
    from dataclasses import fields

    from coordinator.record import LoopStats
    from specdec.client.convert import stats_from_proto, stats_to_proto
    from specdec.client.types import Stats
    from specdec.messages import message_from
    from specdec.v1 import generate_pb2

    wire = [f.name for f in generate_pb2.GenerationStats.DESCRIPTOR.fields]
    assert sorted(f.name for f in fields(Stats)) == sorted(wire)
    by_service = {"prompt_tokens", "generated_tokens", "coordinator_replica",
                  "coordinator_node"}
    assert [n for n in wire if n not in by_service and not hasattr(LoopStats(), n)] == []
    msg = generate_pb2.GenerationStats()
    for i, f in enumerate(msg.DESCRIPTOR.fields, start=1):  # a distinct value in each
        value = getattr(msg, f.name)
        if hasattr(value, "extend"):
            value.extend([str(i)] if f.type == f.TYPE_STRING else [i])
        else:
            setattr(msg, f.name, str(i) if f.type == f.TYPE_STRING else i)
    assert stats_to_proto(stats_from_proto(msg)) == msg
    loop = LoopStats(pipelined_rounds=3, k_per_round=[2, 0])
    made = message_from(generate_pb2.GenerationStats, loop, prompt_tokens=5)
    assert (made.pipelined_rounds, list(made.k_per_round), made.prompt_tokens) == (3, [2, 0], 5)

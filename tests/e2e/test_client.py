"""specdec.client against a real coordinator: the same results as the raw stub, sync and
async, unary and streaming; errors with the server's message; closed streams cancel
their RPC; `specdec generate` prints what it printed when it called the stub itself."""

from __future__ import annotations

import asyncio
import json
import re

import grpc
import pytest
from google.protobuf.json_format import MessageToDict

from specdec.cli import main as specdec_main
from specdec.client import (
    AsyncClient,
    Chunk,
    Client,
    Completion,
    DeadlineExceededError,
    InvalidArgumentError,
    TokenKind,
)
from specdec.v1 import generate_pb2
from tests.e2e.conftest import sessions_released

pytestmark = pytest.mark.slow

CHAT = [{"role": "user", "content": "Tell me about speculative decoding."}]
SHORT = dict(prompt="The quick brown fox", max_new_tokens=12, num_draft_tokens=4)
# Runs for seconds (300 tokens) unless cancelled: the tests stop it early.
LONG = dict(prompt="Once upon a time", max_new_tokens=300, num_draft_tokens=4)
BAD = {"max_new_tokens=0": dict(prompt="x", max_new_tokens=0),
       "prompt and messages": dict(prompt="x", messages=CHAT, max_new_tokens=8)}


@pytest.fixture(scope="module")
def client(coordinator):
    with Client(coordinator[0], timeout=60) as c:
        yield c


def run(coro):
    return asyncio.run(coro)


# Two runs of one greedy request give the same text, ids and token texts; not always the
# same kinds: which rounds had drafts at hand depends on timing (a round whose pre-draft
# missed is the target's alone, or waits for drafts when the planner says it pays). So the
# kinds are checked within a run (one per token), the output across runs.


def joined(chunks: list[Chunk]) -> tuple:
    """(text, ids, token_texts) of a stream's chunks put together."""
    assert all(len(c.kinds) == len(c.token_ids) for c in chunks)
    return ("".join(c.text for c in chunks), tuple(t for c in chunks for t in c.token_ids),
            tuple(t for c in chunks for t in c.token_texts))


def fields(done: Completion) -> tuple:
    assert len(done.kinds) == len(done.token_ids)
    return done.text, done.token_ids, done.token_texts


def raw_request(prompt: str = "", messages=(), **others) -> generate_pb2.GenerateRequest:
    """The request for the same options, built by hand for the raw stub (the options
    here are proto fields, or chat messages as dicts or tuples)."""
    chat = [generate_pb2.ChatMessage(**m) if isinstance(m, dict)
            else generate_pb2.ChatMessage(role=m[0], content=m[1]) for m in messages]
    return generate_pb2.GenerateRequest(prompt=prompt, messages=chat, **others)


def rpc_details(stub, options: dict) -> str:
    """The raw stub's status details for a request it must reject."""
    with pytest.raises(grpc.RpcError) as info:
        stub.Generate(raw_request(**options), timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    return info.value.details()


# -- results ---------------------------------------------------------------------------


@pytest.mark.parametrize("prompt", [dict(prompt="The quick brown fox"), dict(messages=CHAT),
                                    dict(messages=[("user", CHAT[0]["content"])]),
                                    dict(prompt_token_ids=[5, 6, 7, 8])],
                         ids=["text", "chat-dicts", "chat-tuples", "ids"])
def test_generate_equals_the_raw_stub(client, generator_stub, prompt):
    options = dict(prompt, max_new_tokens=12, num_draft_tokens=4)
    raw = generator_stub.Generate(raw_request(**options), timeout=60)
    done = client.generate(**options)
    assert isinstance(done, Completion)
    assert done.text == raw.text and done.token_ids == tuple(raw.token_ids)
    assert len(done.kinds) == len(raw.kinds) == len(raw.token_ids)  # kinds: see `fields`
    assert {k.value for k in done.kinds} <= set(generate_pb2.TokenKind.values()) - {0}
    assert done.token_texts == tuple(raw.token_texts)
    assert done.finish_reason == raw.finish_reason
    assert done.stats.prompt_tokens == raw.stats.prompt_tokens
    assert done.stats.generated_tokens == raw.stats.generated_tokens == len(done.token_ids)


def test_stream_joins_to_the_unary_result(client):
    options = dict(SHORT, num_draft_tokens=1)  # K=1: several rounds, several chunks
    done = client.generate(**options)
    chunks = list(client.stream(**options))
    assert len(chunks) > 1
    assert joined(chunks) == fields(done)
    assert all("".join(c.token_texts) == c.text for c in chunks)
    assert "".join(done.token_texts) == done.text
    assert [c.finish_reason for c in chunks[:-1]] == [None] * (len(chunks) - 1)
    assert [c.stats for c in chunks[:-1]] == [None] * (len(chunks) - 1)
    assert chunks[-1].finish_reason == done.finish_reason
    assert chunks[-1].stats.generated_tokens == len(done.token_ids)


def test_async_generate_and_stream_equal_sync(client, coordinator):
    options = dict(SHORT, num_draft_tokens=1)
    done = client.generate(**options)

    async def both():
        async with AsyncClient(coordinator[0], timeout=60) as aclient:
            unary = await aclient.generate(**options)
            return unary, [chunk async for chunk in aclient.stream(**options)]

    unary, chunks = run(both())
    assert fields(unary) == fields(done) and unary.finish_reason == done.finish_reason
    assert len(chunks) > 1 and joined(chunks) == fields(done)
    assert chunks[-1].finish_reason == done.finish_reason and chunks[-1].stats is not None


def test_greedy_target_only_equals_speculative_and_typed_fields(client):
    base = client.generate(**dict(SHORT, num_draft_tokens=0))
    spec = client.generate(**dict(SHORT, num_draft_tokens=4))
    assert spec.token_ids == base.token_ids and spec.text == base.text
    assert set(base.kinds) == {TokenKind.TARGET}
    assert base.stats.acceptance_rate is None  # K=0 drafts nothing
    assert all(isinstance(k, TokenKind) for k in spec.kinds)
    assert spec.stats.accepted_tokens == spec.kinds.count(TokenKind.ACCEPTED)
    rate = spec.stats.acceptance_rate
    assert rate is not None and 0.0 <= rate <= 1.0
    assert rate == spec.stats.accepted_tokens / spec.stats.drafted_tokens
    assert spec.stats.tokens_per_round >= 1.0 and spec.finish_reason in ("length", "eos")


def test_server_default_sampling_is_greedy(client):
    """Options left unset are the server's defaults: greedy, so equal to temperature 0."""
    assert client.generate("Hello", max_new_tokens=8).token_ids == client.generate(
        "Hello", max_new_tokens=8, temperature=0.0, top_k=0, top_p=0.0, seed=0).token_ids


# -- errors ----------------------------------------------------------------------------


@pytest.mark.parametrize("bad", BAD.values(), ids=BAD.keys())
def test_bad_request_is_invalid_argument_sync(client, generator_stub, bad):
    message = rpc_details(generator_stub, bad)
    for call in (client.generate, lambda **kw: list(client.stream(**kw))):
        with pytest.raises(InvalidArgumentError) as info:
            call(**bad)
        assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert info.value.status_name == "INVALID_ARGUMENT"
        assert info.value.message == message


@pytest.mark.parametrize("bad", BAD.values(), ids=BAD.keys())
def test_bad_request_is_invalid_argument_async(coordinator, generator_stub, bad):
    message = rpc_details(generator_stub, bad)

    async def failures():
        out = []
        async with AsyncClient(coordinator[0], timeout=60) as aclient:
            for call in (aclient.generate, lambda **kw: _drain(aclient.stream(**kw))):
                try:
                    await call(**bad)
                except InvalidArgumentError as e:
                    out.append(e)
        return out

    errors = run(failures())
    assert len(errors) == 2
    assert [(e.code, e.message) for e in errors] == [(grpc.StatusCode.INVALID_ARGUMENT,
                                                      message)] * 2


async def _drain(stream) -> list[Chunk]:
    return [chunk async for chunk in stream]


# -- cancellation ----------------------------------------------------------------------
# What is checked is the client's side: that the RPC is cancelled. Whether the server
# then stops is the coordinator's business (tests/e2e/test_generate.py).


def test_closing_a_stream_cancels_its_rpc(client):
    expected = client.generate(**SHORT)
    stream = client.stream(**LONG)
    assert next(stream).token_ids
    call = stream._call  # the gRPC call under the stream
    stream.close()
    assert call.cancelled() and call.code() == grpc.StatusCode.CANCELLED
    assert list(stream) == []  # a closed stream is over
    with client.stream(**LONG) as stream:
        next(stream)
        call = stream._call
    assert call.cancelled()
    stream = client.stream(**LONG)
    next(stream)
    call = stream._call
    del stream  # what breaking out of `for chunk in client.stream(...)` does
    assert call.cancelled()
    assert fields(client.generate(**SHORT)) == fields(expected)
    assert joined(list(client.stream(**SHORT))) == fields(expected)


def test_closing_an_async_stream_cancels_its_rpc(client, coordinator):
    expected = client.generate(**SHORT)

    async def close_three_ways_then_generate():
        cancelled = []
        async with AsyncClient(coordinator[0], timeout=60) as aclient:
            stream = aclient.stream(**LONG)
            async for chunk in stream:
                assert chunk.token_ids
                break
            call = stream._call
            del stream  # what breaking out of `async for ... in aclient.stream(...)` does
            cancelled.append(call.cancelled())
            stream = aclient.stream(**LONG)
            await anext(stream)
            await stream.aclose()
            cancelled.append(stream._call.cancelled())
            assert [chunk async for chunk in stream] == []
            async with aclient.stream(**LONG) as stream:
                await anext(stream)
            cancelled.append(stream._call.cancelled())
            # The three generations end on the server moments later; until then they hold
            # slots of the coordinator's cap (4), and a call past it is refused at once.
            # Usually 0.05 s. But now and then Serve's gRPC proxy does not pass a cancel on
            # (seen for the first way, a cancel by garbage collection), and that generation
            # runs to its end (~6 s, more on a loaded machine): a known limitation (through
            # coordinator.deploy.front the cancel is an explicit handle cancel and always
            # arrives, tests/e2e/test_api_tls.py). So wait for the end, not for the cancel;
            # what this test checks is that the client cancels the call.
            assert sessions_released(coordinator[1], coordinator[2], within_s=30)
            return cancelled, await aclient.generate(**SHORT)

    cancelled, done = run(close_three_ways_then_generate())
    assert cancelled == [True, True, True]
    assert fields(done) == fields(expected)


def test_deadline_exceeded(client, coordinator):
    with pytest.raises(DeadlineExceededError) as info:
        client.generate(**LONG, timeout=0.3)
    assert info.value.status_name == "DEADLINE_EXCEEDED"
    with pytest.raises(DeadlineExceededError):
        list(client.stream(**LONG, timeout=0.3))

    async def late():
        async with AsyncClient(coordinator[0], timeout=0.3) as aclient:
            with pytest.raises(DeadlineExceededError):
                await aclient.generate(**LONG)
            with pytest.raises(DeadlineExceededError):
                await _drain(aclient.stream(**LONG))

    run(late())


# -- specdec generate ------------------------------------------------------------------


# Counts of what pipelining did, which depend on timing: a zero is left out of a message's
# JSON, so even whether they appear differs between two runs of the same request. So do
# the reasons K was 0 (kReason): "one token left" is there only when a round starts with
# one token to go, and where rounds break depends on which pre-drafts held.
PIPELINE_COUNTS = {"pipelinedRounds", "predraftsWasted", "guessRounds", "guessRejections",
                   "guessBonusMisses", "kReason"}


def without_timing(d: dict) -> dict:
    """A response or chunk as JSON, less what depends on timing (see `fields`): the
    seconds, the kinds (their count stays), the round counts (the keys stay, but those
    of PIPELINE_COUNTS)."""
    d = json.loads(json.dumps(d))
    if "kinds" in d:
        assert len(d["kinds"]) == len(d.get("tokenIds", []))
        d["kinds"] = len(d["kinds"])
    if "stats" in d:
        d["stats"] = {k: v for k, v in d["stats"].items()
                      if k in ("promptTokens", "generatedTokens")} | {
            "keys": sorted(set(d["stats"]) - PIPELINE_COUNTS)}
    return d


JOINED = ("text", "tokenIds", "kinds", "tokenTexts")  # what a stream's chunks add up


def joined_json(chunks: list[dict]) -> dict:
    """A stream's chunks (as JSON, less timing) put together."""
    return {"text": "".join(c.get("text", "") for c in chunks),
            "tokenIds": [t for c in chunks for t in c.get("tokenIds", [])],
            "kinds": sum(c.get("kinds", 0) for c in chunks),
            "tokenTexts": [t for c in chunks for t in c.get("tokenTexts", [])]}


def cli(capsys, coordinator, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = specdec_main(["generate", "--address", coordinator[0], "--timeout", "60", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


CLI_ARGS = ("--max-new-tokens", "12", "--k", "1", "The quick brown fox")


def test_cli_prints_the_text(capsys, coordinator, generator_stub):
    request = raw_request(**dict(SHORT, num_draft_tokens=1))
    raw = generator_stub.Generate(request, timeout=60)
    assert cli(capsys, coordinator, *CLI_ARGS) == (0, raw.text + "\n", "")
    chunks = list(generator_stub.GenerateStream(request, timeout=60))
    assert cli(capsys, coordinator, "--stream", *CLI_ARGS) == (
        0, "".join(c.text for c in chunks) + "\n", "")


def test_cli_json_is_the_wire_message(capsys, coordinator, generator_stub):
    request = raw_request(**dict(SHORT, num_draft_tokens=1))
    raw = generator_stub.Generate(request, timeout=60)
    rc, out, err = cli(capsys, coordinator, "--json", *CLI_ARGS)
    assert (rc, err) == (0, "") and out.startswith("{\n  ")  # indented
    assert without_timing(json.loads(out)) == without_timing(
        MessageToDict(raw, always_print_fields_with_no_presence=True))
    chunks = list(generator_stub.GenerateStream(request, timeout=60))
    rc, out, err = cli(capsys, coordinator, "--stream", "--json", *CLI_ARGS)
    assert (rc, err) == (0, "")
    lines = out.splitlines()
    # A chunk per round: where the chunks break is timing too, so the chunks are compared
    # joined, and the last (finish reason and stats) as itself.
    printed = [without_timing(json.loads(line)) for line in lines]
    wire = [without_timing(MessageToDict(c)) for c in chunks]
    assert joined_json(printed) == joined_json(wire)
    assert {k: v for k, v in printed[-1].items() if k not in JOINED} == \
        {k: v for k, v in wire[-1].items() if k not in JOINED}
    assert "stats" in lines[-1] and all("stats" not in line for line in lines[:-1])


def test_cli_chat(capsys, coordinator, client):
    done = client.generate(messages=[("user", "Hello!")], max_new_tokens=12)
    assert cli(capsys, coordinator, "--chat", "--max-new-tokens", "12", "Hello!") == (
        0, done.text + "\n", "")


@pytest.mark.parametrize("stream", [(), ("--stream",)], ids=["unary", "stream"])
def test_cli_prints_the_servers_error(capsys, coordinator, generator_stub, stream):
    message = rpc_details(generator_stub, dict(prompt="x", max_new_tokens=0))
    assert cli(capsys, coordinator, *stream, "--max-new-tokens", "0", "x") == (
        1, "", f"error: INVALID_ARGUMENT: {message}\n")


def test_cli_structured_output_flags(capsys, coordinator, tmp_path):
    rc, out, _ = cli(capsys, coordinator, "--choice", "yes", "no", "--max-new-tokens", "8",
                     "Say yes or no.")
    assert rc == 0 and out in ("yes\n", "no\n")
    rc, out, _ = cli(capsys, coordinator, "--regex", "[0-9]{2}", "--max-new-tokens", "8", "N")
    assert rc == 0 and re.fullmatch(r"[0-9]{2}\n", out)
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps({"type": "object", "additionalProperties": False,
                                  "required": ["ok"], "properties": {"ok": {"type": "boolean"}}}))
    rc, out, _ = cli(capsys, coordinator, "--json-schema", f"@{schema}", "--max-new-tokens",
                     "16", "Is it ok?")
    assert rc == 0 and json.loads(out) in ({"ok": True}, {"ok": False})
    rc, _, err = cli(capsys, coordinator, "--regex", "(", "x")
    assert rc == 1 and "INVALID_ARGUMENT" in err and "sampling.grammar" in err

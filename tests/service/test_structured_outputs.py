"""Structured outputs with speculation on, over the real services (specdec.grammar): the
target masks p at every verified position and the draft masks q, so greedy constrained
output equals target-only constrained output token for token, it matches its grammar,
and sampled constrained output follows the constrained target distribution."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import jsonschema
import pytest

from coordinator.loop import SpeculativeLoop
from coordinator.loop.policy import LoopPolicy
from specdec.grammar import Grammar, Grammars, mask
from specdec.runtime.models import load_tokenizer
from specdec.sampling import SamplingParams
from tests.service.test_sampled_distribution import (
    chi_square_p_value,
    sample_outputs,
    target_joint,
)

PROMPT = [31, 415, 92, 65, 31, 7]
EOS = 2
SCHEMA = {"type": "object", "additionalProperties": False,
          "required": ["ok", "n", "tag"],
          "properties": {"ok": {"type": "boolean"},
                         "n": {"type": "integer", "minimum": 0, "maximum": 99},
                         "tag": {"enum": ["red", "green", "blue"]}}}
GRAMMARS = {
    "json_schema": Grammar.of("json_schema", json.dumps(SCHEMA)),
    "regex": Grammar.of("regex", r"(yes|no), [0-9]{1,3}"),
    "choice": Grammar.of("choice", json.dumps(["alpha", "beta", "gamma delta"])),
    "lark": Grammar.of("lark", 'start: "sum(" NUM ("," NUM)* ")"\nNUM: /[0-9]{1,2}/'),
    "gbnf": Grammar.of("lark", 'root ::= "v" [0-9] [0-9]? "." [0-9]'),
}


def matches(name: str, text: str) -> bool:
    if name == "json_schema":
        try:
            jsonschema.validate(json.loads(text), SCHEMA)
        except (ValueError, jsonschema.ValidationError):
            return False
        return True
    pattern = {"regex": r"(yes|no), [0-9]{1,3}", "choice": r"alpha|beta|gamma delta",
               "lark": r"sum\([0-9]{1,2}(,[0-9]{1,2})*\)", "gbnf": r"v[0-9][0-9]?\.[0-9]"}
    return re.fullmatch(pattern[name], text) is not None


def constrained(grammar: Grammar, prompt=PROMPT, **kw) -> SamplingParams:
    return SamplingParams(grammar=grammar, prompt_len=len(prompt), **kw)


@pytest.fixture()
def loop(draft_client, target_client):
    return SpeculativeLoop(draft_client, target_client, LoopPolicy(pipeline=True))


@pytest.mark.parametrize("name", sorted(GRAMMARS))
def test_greedy_constrained_equals_target_only_and_matches(loop, name):
    params = constrained(GRAMMARS[name])
    base = loop.generate(PROMPT, 48, params, 0, eos_token_ids=[EOS])
    spec = loop.generate(PROMPT, 48, params, 4, eos_token_ids=[EOS])
    assert spec.token_ids == base.token_ids
    assert spec.finish_reason == "eos"
    assert spec.stats.accepted_tokens > 0
    text = load_tokenizer("tiny-random").decode(spec.token_ids[:-1])
    assert matches(name, text), text


def test_sampled_constrained_outputs_always_match(loop):
    """50 seeded sampled runs, each a JSON value the schema accepts."""
    tokenizer = load_tokenizer("tiny-random")
    params = constrained(GRAMMARS["json_schema"], temperature=1.0)
    accepted = 0
    for seed in range(50):
        result = loop.generate(PROMPT, 64, replace(params, seed=seed), 4, eos_token_ids=[EOS])
        assert result.finish_reason == "eos", seed
        text = tokenizer.decode(result.token_ids[:-1])
        assert matches("json_schema", text), (seed, text)
        accepted += result.stats.accepted_tokens
    assert accepted > 0


def _constrained_joint(backend, grammar: Grammar, params: SamplingParams):
    """The exact law of the first two tokens under the masked target."""
    grammars = Grammars(lambda: backend.loaded.tokenizer, backend.vocab_size)

    def masked(logits, context):
        state = grammars.new_state(grammar, len(PROMPT))
        state.sync(context)
        return mask(logits, state.masks([], logits.shape[1]))

    return target_joint(backend, params, prompt=PROMPT, transform=masked)


@pytest.mark.slow
def test_sampled_constrained_follows_the_constrained_target(draft_client, target_client,
                                                            target_server):
    grammar = Grammar.of("regex", "[a-f][a-f ]{1,6}")
    params = constrained(grammar, temperature=1.0)
    expected = _constrained_joint(target_server[1].model.backend, grammar, params)
    loop = SpeculativeLoop(draft_client, target_client, LoopPolicy(pipeline=False))
    trials = 1200
    counts, accepted, drafted = sample_outputs(loop, PROMPT, params, trials, 2)
    assert 0 < accepted < drafted
    assert set(counts) <= set(expected)  # never a token the grammar refuses
    p_value = chi_square_p_value(counts, expected, trials)
    assert p_value > 1e-3, (p_value, counts.most_common(8))


def test_a_predraft_from_drafts_the_grammar_refuses_still_drafts(draft_server):
    """A pipelined pre-draft feeds the draft drafts it assumes accepted (a look-up's may
    break the grammar): the draft answers, unconstrained past them (never committed)."""
    from draft_service.engine import ProposeArgs

    engine = draft_server[1]
    tokenizer = load_tokenizer("tiny-random")
    params = constrained(GRAMMARS["regex"])
    assumed = PROMPT + tokenizer.encode("maybe", add_special_tokens=False)
    result = engine.propose(ProposeArgs(session_id="predraft-off-grammar", keep_len=0,
                                        keep_digest=0, new_tokens=assumed, num_tokens=3,
                                        sampling=params))
    assert len(result.tokens) == 3
    engine.release("predraft-off-grammar")


def guide_for(grammar: Grammar, prompt=PROMPT):
    from specdec.runtime.models import TINY_VOCAB

    return Grammars(lambda: load_tokenizer("tiny-random"), TINY_VOCAB).new_state(
        grammar, len(prompt))


@pytest.mark.parametrize("name", sorted(GRAMMARS))
@pytest.mark.parametrize("k", [0, 4])
def test_jump_forward_commits_forced_tokens_without_changing_the_output(loop, name, k):
    """With the coordinator's matcher, what the grammar forces (at least the end of
    sequence after a complete text) is committed without a pass: the same tokens, no
    more rounds (target-only: one fewer per forced token)."""
    params = constrained(GRAMMARS[name])
    plain = loop.generate(PROMPT, 48, params, k, eos_token_ids=[EOS])
    jumped = loop.generate(PROMPT, 48, params, k, eos_token_ids=[EOS],
                           guide=guide_for(GRAMMARS[name]))
    assert jumped.token_ids == plain.token_ids and jumped.finish_reason == "eos"
    assert jumped.stats.forced_tokens >= 1 and plain.stats.forced_tokens == 0
    if k == 0:  # a round per token, less one per forced token
        assert jumped.stats.rounds == plain.stats.rounds - jumped.stats.forced_tokens
    else:
        assert jumped.stats.rounds <= plain.stats.rounds


def test_sampled_jump_forward_stays_valid(loop):
    params = constrained(GRAMMARS["json_schema"], temperature=1.0)
    tokenizer = load_tokenizer("tiny-random")
    for seed in range(10):
        result = loop.generate(PROMPT, 64, replace(params, seed=seed), 4, eos_token_ids=[EOS],
                               guide=guide_for(GRAMMARS["json_schema"]))
        assert matches("json_schema", tokenizer.decode(result.token_ids[:-1])), seed
        assert result.stats.forced_tokens >= 1


def test_lookup_drafts_stop_where_the_grammar_refuses_them(draft_client, target_client):
    """A look-up that would draft the prompt's text back: with the coordinator's matcher,
    no draft the grammar refuses reaches the target."""
    from coordinator.drafters.base import LOOKUP

    prompt = PROMPT + [65, 31, 7, 65, 31, 7]  # repeats: the look-up finds matches
    looking = SpeculativeLoop(None, target_client, LoopPolicy(pipeline=False, drafter=LOOKUP))
    params = constrained(GRAMMARS["regex"], prompt)
    plain = looking.generate(prompt, 24, params, 4, eos_token_ids=[EOS])
    guided = looking.generate(prompt, 24, params, 4, eos_token_ids=[EOS],
                              guide=guide_for(GRAMMARS["regex"], prompt))
    assert guided.token_ids == plain.token_ids
    assert plain.stats.drafted_tokens > plain.stats.accepted_tokens  # refused drafts sent
    assert guided.stats.drafted_tokens == guided.stats.accepted_tokens  # none refused


def test_bad_grammars_over_grpc_fail_only_their_own_item(target_stub, draft_stub):
    import grpc

    from specdec import wire
    from specdec.v1 import common_pb2, target_pb2
    from tests.service.conftest import propose_req, verify_req

    def sampling(grammar: Grammar, spec: bool = True):
        return wire.sampling_to_proto(constrained(grammar), grammar_spec=spec)

    good = verify_req("g-good", PROMPT + [5], num_draft=1,
                      sampling=sampling(GRAMMARS["regex"]))
    bad = verify_req("g-bad", PROMPT, sampling=sampling(Grammar.of("regex", "(")))
    unheld = verify_req("g-unheld", PROMPT, keep_len=2, prefix=PROMPT,
                        sampling=sampling(GRAMMARS["choice"], spec=False))
    plain = verify_req("g-plain", PROMPT)
    batch = target_stub.VerifyBatch(target_pb2.VerifyBatchRequest(
        items=[good, bad, unheld, plain]), timeout=30)
    outcome = [item.WhichOneof("outcome") for item in batch.items]
    assert outcome == ["result", "error", "error", "result"]
    assert batch.items[1].error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert "unclosed group" in batch.items[1].error.message
    assert batch.items[2].error.code in (grpc.StatusCode.NOT_FOUND.value[0],
                                         grpc.StatusCode.FAILED_PRECONDITION.value[0])
    # a session that holds no grammar, named by digest: resync from the start
    target_stub.Verify(verify_req("g-plain2", PROMPT), timeout=30)
    with pytest.raises(grpc.RpcError) as info:
        target_stub.Verify(verify_req("g-plain2", [5], keep_len=len(PROMPT), prefix=PROMPT,
                                      sampling=sampling(GRAMMARS["choice"], spec=False)),
                           timeout=30)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "keep_len = 0" in info.value.details()
    assert dict(info.value.trailing_metadata()).get("specdec-cached-len") == "0"
    with pytest.raises(grpc.RpcError) as info:
        draft_stub.Propose(propose_req("g-draft-bad", PROMPT, sampling=sampling(
            Grammar.of("json_schema", '{"type": 5}'))), timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    unset = common_pb2.SamplingParams(grammar=common_pb2.Grammar(spec="a+"))
    with pytest.raises(grpc.RpcError) as info:
        target_stub.Verify(verify_req("g-kind", PROMPT, sampling=unset), timeout=30)
    assert "sampling.grammar.kind must be set" in info.value.details()
    for stub, sid in ((target_stub, "g-good"), (target_stub, "g-plain"),
                      (target_stub, "g-plain2")):
        release(stub, sid)


def release(stub, session_id):
    from specdec.v1 import common_pb2

    stub.Release(common_pb2.ReleaseRequest(session_id=session_id), timeout=10)

"""specdec.grammar on the tiny tokenizer: the matcher follows the session's ids (sync
rolls back and consumes), each verified row's mask is the mask after the drafts before
it, a committed token the grammar refuses is a clear error, a grammar named only by
digest needs a session that holds it, and `check` explains every bad grammar."""

from __future__ import annotations

import json

import pytest
import torch

from specdec import wire
from specdec.errors import FailedPrecondition, InvalidArgument
from specdec.grammar import Grammar, Grammars, GrammarState, check, mask, unpack
from specdec.runtime.models import TINY_VOCAB, load_tokenizer
from specdec.sampling import SamplingParams

TOKENIZER = load_tokenizer("tiny-random")
PROMPT = [31, 415, 92]
REGEX = Grammar.of("regex", "(yes|no), [0-9]{1,3}")


class Session:
    session_id = "s"
    grammar = None


def state(grammar: Grammar = REGEX, session=None):
    grammars = Grammars(lambda: TOKENIZER, TINY_VOCAB)
    return grammars, grammars.state(session or Session(), grammar, len(PROMPT))


def ids(text: str) -> list[int]:
    return TOKENIZER.encode(text, add_special_tokens=False)


def test_each_row_masks_as_after_the_drafts_before_it():
    _, s = state()
    s.sync(PROMPT)
    drafts = ids("yes, 4")
    rows = s.masks(drafts, TINY_VOCAB)
    assert rows.shape == (len(drafts) + 1, TINY_VOCAB)
    for r in range(len(drafts) + 1):  # a fresh matcher fed the first r drafts
        _, fresh = state()
        fresh.sync(PROMPT + drafts[:r])
        assert torch.equal(rows[r], fresh.masks([], TINY_VOCAB)[0]), r
        if r < len(drafts):
            assert rows[r, drafts[r]]
    assert not rows[0, ids("maybe")[0]]


def test_rows_after_a_refused_draft_are_left_open_and_the_matcher_survives():
    _, s = state()
    s.sync(PROMPT)
    drafts = ids("yes") + ids("!") + ids(", 1")
    rows = s.masks(drafts, TINY_VOCAB)
    bad = len(ids("yes"))
    assert not rows[bad, drafts[bad]]  # the refused draft gets p = 0
    assert rows[bad + 1:].all()  # never used: the round is decided at `bad`
    s.sync(PROMPT + ids("yes, 12"))  # back in step with what was committed
    assert s.consumed == ids("yes, 12")


def test_sync_rolls_back_rejected_drafts():
    _, s = state()
    s.sync(PROMPT + ids("no, 9"))
    s.sync(PROMPT + ids("no"))
    assert s.consumed == ids("no")
    before = s.masks([], TINY_VOCAB)
    _, fresh = state()
    fresh.sync(PROMPT + ids("no"))
    assert torch.equal(before, fresh.masks([], TINY_VOCAB))


def test_a_committed_token_the_grammar_refuses_is_invalid_argument():
    _, s = state()
    with pytest.raises(InvalidArgument, match=r"breaks the request's regex grammar"):
        s.sync(PROMPT + ids("maybe"))


def test_after_the_end_only_the_end_is_allowed():
    _, s = state(Grammar.of("choice", json.dumps(["ok"])))
    s.sync(PROMPT + ids("ok"))
    row = s.masks([], TINY_VOCAB)[0]
    assert row.nonzero().flatten().tolist() == [TOKENIZER.eos_token_id]
    s.consume(TOKENIZER.eos_token_id)
    assert s.masks([], TINY_VOCAB)[0].nonzero().flatten().tolist() == \
        [TOKENIZER.eos_token_id]  # stopped: never an empty row


def test_a_grammar_named_by_digest_needs_the_session_that_holds_it():
    grammars, _ = state()
    named = Grammar(REGEX.kind, "", REGEX.digest)
    with pytest.raises(FailedPrecondition, match="keep_len = 0"):
        grammars.state(Session(), named, len(PROMPT))
    session = Session()
    held = grammars.state(session, REGEX, len(PROMPT))
    assert grammars.state(session, named, len(PROMPT)) is held


def test_the_wire_leaves_the_text_off_after_the_start():
    params = SamplingParams(grammar=REGEX, prompt_len=3)
    assert wire.sampling_from_proto(wire.sampling_to_proto(params)) == params
    short = wire.sampling_to_proto(params, grammar_spec=False)
    assert short.grammar.spec == "" and short.grammar.digest == REGEX.digest
    assert wire.sampling_from_proto(short).grammar == Grammar("regex", "", REGEX.digest)
    forged = wire.sampling_to_proto(params)
    forged.grammar.digest = 12345  # a sent digest is recomputed from the text
    assert wire.sampling_from_proto(forged).grammar.digest == REGEX.digest


@pytest.mark.parametrize("grammar, says", [
    (Grammar.of("json_schema", "[1]"), "must be a JSON object"),
    (Grammar.of("json_schema", '{"type": 5}'), "type must be a string"),
    (Grammar.of("json_schema", "{not json"), "line 1"),
    (Grammar.of("regex", "(unclosed"), "unclosed group"),
    (Grammar.of("choice", "[]"), "non-empty list"),
    (Grammar.of("lark", "start: undefined_rule"), "undefined_rule"),
    (Grammar.of("regex", ""), "needs its text"),
    (Grammar.of("yaml", "a: 1"), "unknown grammar kind"),
    (Grammar.of("lark", 'start: x\nx[max_tokens=3]: /[a-z]+/'), "cannot be rolled back"),
])
def test_check_explains_a_bad_grammar(grammar, says):
    assert says in check(grammar)


def test_masking_sets_refused_logits_to_minus_infinity():
    logits = torch.zeros(2, 4)
    allowed = torch.tensor([[True, False, True, False], [False, False, False, True]])
    out = mask(logits, allowed)
    assert torch.isinf(out[~allowed]).all() and (out[allowed] == 0).all()
    bits = torch.tensor([[0b101], [1 << 3]], dtype=torch.int32)
    assert torch.equal(unpack(bits, 4), allowed)


def test_a_drafts_context_the_grammar_refuses_stops_the_matcher_without_an_error():
    _, s = state()
    assert not s.sync(PROMPT + ids("yes") + ids("!!") + ids(", 1"), strict=False)
    assert s.consumed == ids("yes")  # held up to the refused token, still usable
    assert s.sync(PROMPT + ids("yes, 1"), strict=False)
    assert s.consumed == ids("yes, 1")


def test_the_coordinator_sends_the_grammars_text_only_to_start_a_session():
    from coordinator.remote.clients import propose_request, verify_request
    from specdec.propose import ProposeOptions
    from specdec.sync import SyncRequest

    params = SamplingParams(grammar=REGEX, prompt_len=3)
    for keep_len, spec in ((0, REGEX.spec), (3, "")):
        sync = SyncRequest("s", keep_len, 0, [5])
        for req in (propose_request(sync, params, ProposeOptions(num_tokens=2)),
                    verify_request(sync, [6], [], params, 1)):
            assert req.sampling.grammar.spec == spec
            assert req.sampling.grammar.digest == REGEX.digest


def test_a_grammar_that_cannot_roll_back_is_restarted_and_refed():
    """llguidance refuses to roll back past a stop= lexeme (and its matcher then stays
    in its error state): sync starts a new matcher and feeds the ids again."""
    from llguidance import LLMatcher

    grammar = Grammar.of("lark", 'start: "A: " ans\nans[stop="\\n"]: /[a-z ]+/')
    assert "cannot be rolled back" in check(grammar)  # refused at the door...
    grammars, _ = state()
    compiled = LLMatcher(grammars.vocabulary, grammar.llguidance(), log_level=0)

    def new():  # ...but should a rollback fail anyway, the matcher starts again
        return GrammarState(grammar, compiled, len(PROMPT), [2], TINY_VOCAB)

    s = new()
    text = ids("A: the quick brown")
    s.sync(PROMPT + text)
    assert not s.matcher.deep_copy().rollback(2)  # what llguidance does here
    s.sync(PROMPT + text[:-2])
    assert s.consumed == text[:-2] and not s.matcher.is_error()
    fresh = new()
    fresh.sync(PROMPT + text[:-2])
    assert torch.equal(s.masks([], TINY_VOCAB), fresh.masks([], TINY_VOCAB))


def test_a_grammar_is_compiled_once_per_digest_and_refused_with_its_reason():
    grammars, _ = state()
    a, b = Session(), Session()
    assert grammars.state(a, REGEX, 3)._fresh is grammars.state(b, REGEX, 3)._fresh
    with pytest.raises(InvalidArgument, match="unclosed group"):
        grammars.state(Session(), Grammar.of("regex", "(x"), 3)
    with pytest.raises(InvalidArgument, match="spec is empty"):
        grammars.state(Session(), Grammar("regex", "", 5), 3, starting=True)

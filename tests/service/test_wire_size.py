"""Few bytes on the wire: sampled rounds carry compact quantised q's (design section 5),
greedy replies carry no distributions."""

from __future__ import annotations

import math
import uuid

import grpc
import pytest

from draft_service.config import from_args
from specdec import wire
from specdec.sampling import Q_TOTAL
from specdec.v1 import common_pb2
from tests.service.conftest import GREEDY, propose_req, verify_req
from tests.service.test_status_codes import assert_status

PROMPT = [12, 34, 56, 78, 90]
SAMPLED = common_pb2.SamplingParams(temperature=1.5, seed=3)  # flat: q fills all top_n slots


def sampled_round(draft_stub, target_stub, **propose_fields):
    """One K=4 round; returns (proposal, bytes of both calls, both directions), counted as
    coordinator.remote.clients.WireBytes counts them."""
    s = uuid.uuid4().hex
    propose = propose_req(s, PROMPT, k=4, sampling=SAMPLED)
    for name, value in propose_fields.items():
        setattr(propose, name, value)
    proposal = draft_stub.Propose(propose)
    verify = verify_req(s, PROMPT + list(proposal.tokens), num_draft=4,
                        dists=proposal.dists, sampling=SAMPLED)
    verdict = target_stub.Verify(verify)
    assert len(verdict.target_probs) == len(verdict.recovered_tokens) == 4
    size = propose.ByteSize() + proposal.ByteSize() + verify.ByteSize() + verdict.ByteSize()
    return proposal, size


def test_sampled_k4_round_under_1200_bytes(draft_stub, target_stub):
    """The draft's defaults (top_n 32, top_mass 0.99) on a flat q: the cap binds."""
    proposal, size = sampled_round(draft_stub, target_stub)
    assert len(proposal.dists) == 4
    assert all(len(d.counts) == 32 for d in proposal.dists)
    assert size <= 1200, size


def test_draft_sends_the_compact_form_it_sampled_from(draft_stub, target_stub):
    proposal, _ = sampled_round(draft_stub, target_stub, top_n=64, top_mass=1.0)
    for x, d in zip(proposal.tokens, proposal.dists, strict=True):
        assert not d.token_ids and not d.probs
        assert len(d.id_deltas) == len(d.counts) == 64
        assert all(delta >= 1 for delta in list(d.id_deltas)[1:])  # ascending ids
        assert min(d.counts) >= 1 and sum(d.counts) == Q_TOTAL
        assert wire.dist_from_proto(d).prob_of(x) > 0


def test_top_mass_keeps_fewer_tokens(draft_stub, target_stub):
    sizes = {}
    for mass in (1.0, 0.3, 0.1, 1e-6):  # the top 64 hold about half of this flat q
        proposal, sizes[mass] = sampled_round(draft_stub, target_stub, top_n=64,
                                              top_mass=mass)
        if mass == 1e-6:  # the most likely token alone
            assert all(list(d.counts) == [Q_TOTAL] for d in proposal.dists)
    assert sizes[1.0] > sizes[0.3] > sizes[0.1] > sizes[1e-6]


@pytest.mark.parametrize("mass", [-0.1, 1.5, math.nan, math.inf])
def test_bad_top_mass(draft_stub, mass):
    req = propose_req(uuid.uuid4().hex, PROMPT, k=4, sampling=SAMPLED)
    req.top_mass = mass
    assert_status(lambda: draft_stub.Propose(req), grpc.StatusCode.INVALID_ARGUMENT,
                  "top_mass must be in [0, 1]")


@pytest.mark.parametrize("flag", ["0", "1.5", "nan", "x"])
def test_bad_top_mass_flag(flag, capsys):
    with pytest.raises(SystemExit):
        from_args(["--model", "tiny-random-draft", "--top-mass", flag])
    assert "--top-mass" in capsys.readouterr().err


def test_greedy_replies_carry_no_distributions(draft_stub, target_stub):
    s = uuid.uuid4().hex
    proposal = draft_stub.Propose(propose_req(s, PROMPT, k=4, sampling=GREEDY))
    assert len(proposal.dists) == 0
    assert proposal.ByteSize() < 64
    verdict = target_stub.Verify(verify_req(s, PROMPT + list(proposal.tokens), num_draft=4))
    assert set(verdict.target_probs) <= {0.0, 1.0}
    assert verdict.ByteSize() < 64

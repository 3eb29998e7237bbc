"""specdec.wire: SparseDist's compact form (ids delta-coded, Quantize-Sample-Verify
counts) and the float form, both decoded to a SparseQ."""

from __future__ import annotations

import pytest
import torch

from specdec import wire
from specdec.errors import InvalidArgument
from specdec.sampling import Q_TOTAL, quantise
from specdec.v1 import common_pb2
from specdec.verify import SparseQ

VOCAB = 49152


def _round_trip(ids: list[int], probs: list[float]) -> tuple[SparseQ, common_pb2.SparseDist]:
    q = SparseQ.quantised(torch.tensor(ids), quantise(torch.tensor(probs)))
    msg = wire.dist_to_proto(q)
    return q, common_pb2.SparseDist.FromString(msg.SerializeToString())


@pytest.mark.parametrize(("ids", "probs"), [
    ([7], [1.0]),
    ([0], [1.0]),
    ([VOCAB - 1], [1.0]),
    ([VOCAB - 1, 0], [0.7, 0.3]),
    ([5, 3, 49000, 4, 0, VOCAB - 1], [0.4, 0.2, 0.15, 0.1, 0.1, 0.05]),
    (list(range(100, 0, -1)), [1 / 100] * 100),
], ids=["one", "id 0", "id vocab-1", "both ends", "unsorted", "adjacent ids"])
def test_compact_round_trip(ids, probs):
    q, msg = _round_trip(ids, probs)
    assert not msg.token_ids and not msg.probs  # the compact form only
    assert list(msg.id_deltas)[1:] == [b - a for a, b in zip(sorted(ids), sorted(ids)[1:],
                                                             strict=False)]
    back = wire.dist_from_proto(msg)
    assert back.token_ids.tolist() == sorted(ids)  # ascending
    assert int(back.counts.sum()) == Q_TOTAL
    for token in ids:  # the same q(x), from the same integers
        assert back.prob_of(token) == q.prob_of(token)
        assert back.prob_of(token) == int(q.counts[ids.index(token)]) / Q_TOTAL
    assert back.probs.dtype == torch.float64


def test_compact_form_is_small():
    """64 tokens spread over the vocabulary: about 2 bytes an id and 2 a count, against
    about 3 and 4 in the float form."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randperm(VOCAB, generator=g)[:64].tolist()
    probs = torch.softmax(torch.randn(64, generator=g) * 2, 0).tolist()
    _, msg = _round_trip(ids, probs)
    float_form = common_pb2.SparseDist(token_ids=ids, probs=probs)
    assert msg.ByteSize() < 4 * 64 < 0.6 * float_form.ByteSize()


def test_point_mass_dist():
    msg = wire.point_mass_dist(VOCAB - 1)
    assert list(msg.id_deltas) == [VOCAB - 1] and list(msg.counts) == [Q_TOTAL]
    q = wire.dist_from_proto(msg)
    assert q.prob_of(VOCAB - 1) == 1.0 and q.prob_of(0) == 0.0
    assert list(wire.point_mass_dist(0).id_deltas) == [0]


def test_float_form_still_decodes():
    q = wire.dist_from_proto(common_pb2.SparseDist(token_ids=[9, 2], probs=[0.75, 0.25]))
    assert q.counts is None
    assert q.token_ids.tolist() == [9, 2] and q.prob_of(2) == 0.25


def test_the_encoder_refuses_an_unquantised_q():
    with pytest.raises(ValueError, match="quantised"):
        wire.dist_to_proto(SparseQ(torch.tensor([1]), torch.tensor([1.0])))


@pytest.mark.parametrize(("msg", "fragment"), [
    (common_pb2.SparseDist(), "token_ids and probs must have the same, non-zero length"),
    (common_pb2.SparseDist(id_deltas=[1, 2]), "id_deltas and counts must have the same"),
    (common_pb2.SparseDist(counts=[Q_TOTAL]), "id_deltas and counts must have the same"),
    (common_pb2.SparseDist(id_deltas=[1], counts=[Q_TOTAL], token_ids=[1], probs=[1.0]),
     "not both"),
    (common_pb2.SparseDist(token_ids=[1, 2], probs=[1.0]), "same, non-zero length"),
])
def test_decoder_refuses_fields_that_do_not_pair_up(msg, fragment):
    with pytest.raises(InvalidArgument, match=fragment) as info:
        wire.dist_from_proto(msg, "draft_dists[3]")
    assert info.value.message.startswith("draft_dists[3]: ")

"""The offline replay of the look-up alone (specdec_tools.bench.lookup_replay): pure, on
synthetic token ids and a synthetic cost table."""

from __future__ import annotations

import pytest

from specdec_tools.bench.lookup_replay import replay


def flat(width: int) -> float:
    return 10.0 + 1.0 * (width - 1)  # 10 ms a pass, 1 ms a draft


def test_text_without_repeats_is_target_only_and_costs_no_change():
    r = replay([1, 2, 3], list(range(100, 140)), flat, change_ms=5.0)
    assert (r.tokens, r.rounds, r.drafted, r.accepted, r.width_changes) == (40, 40, 0, 0, 0)
    assert r.speedup == pytest.approx(1.0) and r.speedup_free_changes == pytest.approx(1.0)


def test_a_copied_span_is_drafted_accepted_and_charged_its_widths():
    span = list(range(200, 232))  # 32 ids the prompt holds
    r = replay([7] + span, span, flat, change_ms=5.0)
    assert r.accepted > 20 and r.rounds < 12  # most of the text came from the look-up
    assert r.accepted <= r.drafted
    assert r.tokens == 32
    # every round's tokens: its accepted drafts plus the target's one (but the last
    # round's, when its drafts reach the end of the text)
    assert r.accepted + r.rounds - 1 <= r.tokens <= r.accepted + r.rounds
    assert r.speedup_free_changes > r.speedup > 1.0
    charged_free = 32 * flat(1) / r.speedup_free_changes
    assert 32 * flat(1) / r.speedup == pytest.approx(charged_free + 5.0 * r.width_changes)


def test_empty_text_is_refused():
    with pytest.raises(ValueError, match="empty"):
        replay([1], [], flat, 0.0)


def test_a_negative_measured_change_cost_is_charged_as_nothing():
    span = list(range(200, 232))
    r = replay([7] + span, span, flat, change_ms=-3.0)  # noise on a small model
    assert r.width_changes > 0
    assert r.speedup == pytest.approx(r.speedup_free_changes)

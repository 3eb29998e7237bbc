"""Predicted Outputs' drafter: follows the prediction, realigns after an insertion or a
deletion, and drafts nothing while the output is elsewhere."""

from __future__ import annotations

from coordinator.drafters.costs import LookupSettings
from coordinator.drafters.lookup import LookupDrafter
from coordinator.drafters.prediction import PREDICTION, Prediction

PROMPT = [900, 901, 902]
PREDICTED = list(range(10, 40))  # 30 distinct tokens


def test_drafts_the_next_predicted_tokens_while_the_output_follows():
    p = Prediction(PREDICTED, len(PROMPT), max_tokens=8)
    found = p.find(PROMPT, 16)
    assert found.tokens == PREDICTED[:8] and found.source == PREDICTION
    assert p.find(PROMPT + PREDICTED[:5], 4).tokens == PREDICTED[5:9]
    assert p.find(PROMPT + PREDICTED[:29], 8).tokens == PREDICTED[29:]
    assert not p.find(PROMPT + PREDICTED, 8)  # the prediction is used up


def test_realigns_after_an_insertion_and_a_deletion():
    p = Prediction(PREDICTED, len(PROMPT), max_tokens=4)
    inserted = PREDICTED[:6] + [77, 78] + PREDICTED[6:9]  # two new tokens, then it goes on
    assert p.find(PROMPT + inserted, 4).tokens == PREDICTED[9:13]
    deleted = PREDICTED[:12] + PREDICTED[15:18]  # three predicted tokens left out
    assert p.find(PROMPT + deleted, 4).tokens == PREDICTED[18:22]
    assert not p.find(PROMPT + deleted + [500, 501], 4)  # off the prediction: nothing


def test_a_repeated_phrase_realigns_to_the_occurrence_nearest_the_place_reached():
    text = [1, 2, 3, 50, 51, 1, 2, 3, 60, 61, 1, 2, 3, 70]
    p = Prediction(text, 0, max_tokens=2)
    assert p.find(text[:9] + [99, 2, 3], 2).tokens == [70]  # nearest after position 9
    fresh = Prediction(text, 0, max_tokens=2)
    assert fresh.find([5, 1, 2, 3], 2).tokens == [50, 51]  # from the start: the first


def test_the_lookup_drafts_from_the_prediction_first_and_learns_its_rate():
    settings = LookupSettings()
    drafter = LookupDrafter(PROMPT, settings, prediction=Prediction(PREDICTED, 3, 16))
    assert drafter.cap(4) == 16  # a prediction may draft more than the look-up's 8
    drafts = drafter.propose(PROMPT, drafter.cap(4))
    assert drafts.tokens == PREDICTED[:16] and drafts.source == PREDICTION
    from coordinator.drafters.base import Outcome

    drafter.observe(Outcome(PROMPT + PREDICTED[:3] + [5], drafts, 3))
    assert drafter.prediction.rate < 0.9  # 3 of 16 kept

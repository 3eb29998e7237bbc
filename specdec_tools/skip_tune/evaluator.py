"""Predicted speedup of a skip set: agreement flags (cached per set and sequence) and
measured step costs (kept in a dict the study persists, measured on first need)."""

from __future__ import annotations

from collections.abc import Sequence

from specdec.runtime.layer_skip import SkipSet
from specdec.runtime.models import LoadedModel
from specdec_tools.skip_tune import agreement, timing
from specdec_tools.skip_tune.calibration import Calibration
from specdec_tools.skip_tune.cost import Prediction, StepCosts, best
from specdec_tools.skip_tune.drafts import Setup


class Evaluator:
    """`setup` (specdec_tools.skip_tune.drafts) gives the model whose agreement stands for the
    draft's and the backends to time; `target` is the fp32 model, timed in torch per
    kept-layer count for the depth scaling. `measured` holds {"verify_ms": {n: ms},
    "draft_full_ms": {"0": ms}, "depth_ms": {kept: ms}} with str keys (JSON), filled as
    needed and saved by the caller."""

    def __init__(self, setup: Setup, target: LoadedModel, calibration: Calibration,
                 measured: dict, ks: Sequence[int], threads: int = 1, rpc_ms: float = 1.0):
        self.setup, self.target, self.calibration = setup, target, calibration
        self.measured = measured
        for table in ("verify_ms", "draft_full_ms", "depth_ms"):
            self.measured.setdefault(table, {})
        self.ks, self.threads, self.rpc_ms = tuple(ks), threads, rpc_ms
        self.num_layers = int(target.model.config.num_hidden_layers)
        self._flags: dict[tuple[SkipSet, int], list[bool]] = {}

    def _timed(self, table: str, key: int, fn) -> float:
        if str(key) not in self.measured[table]:
            with timing.threads(self.threads):
                self.measured[table][str(key)] = fn()
        return float(self.measured[table][str(key)])

    def verify_ms(self, n: int) -> float:
        """A target pass over n tokens, from a least-squares line through the measured
        passes over 1 .. max(K)+1 tokens and any others on record (single measurements
        are noisy on a busy CPU)."""
        xs = sorted(set(range(1, max(self.ks) + 2)) | {int(x) for x in self.measured["verify_ms"]})
        a, b = _line(xs, [self._timed("verify_ms", x, lambda x=x: timing.pass_ms(
            self.setup.target, self.setup.vocab, x)) for x in xs])
        return a + b * n

    def draft_ms(self, kept: int) -> float:
        """The draft's step with `kept` layers: its full-depth step on its own backend,
        scaled by torch fp32's t(kept) / t(all), from a line through a few measured
        depths."""
        full = self._timed("draft_full_ms", 0, lambda: timing.pass_ms(
            self.setup.draft_full, self.setup.vocab, 1, reps=15))
        n = self.num_layers
        xs = sorted({1, max(1, n // 3), max(1, 2 * n // 3), n})
        a, b = _line(xs, [self._timed("depth_ms", x, lambda x=x: timing.depth_ms(
            self.target, x, reps=11)) for x in xs])
        return full * (a + b * kept) / (a + b * n)

    def costs(self, skip: SkipSet) -> StepCosts:
        return StepCosts(self.draft_ms(self.num_layers - len(skip)), self.verify_ms,
                         self.rpc_ms)

    def flags(self, skip: SkipSet, index: int) -> list[bool]:
        key = (tuple(skip), index)
        if key not in self._flags:
            self._flags[key] = agreement.flags(self.setup.scored.model,
                                               self.calibration.sequences[index], skip)
        return self._flags[key]

    def predict(self, skip: SkipSet, sequences: int | None = None) -> Prediction:
        """The best-K prediction over the first `sequences` calibration sequences (all by
        default)."""
        n = len(self.calibration.sequences) if sequences is None else sequences
        return best([self.flags(skip, i) for i in range(n)], self.costs(skip), self.ks)


def _line(xs: list[int], ys: list[float]) -> tuple[float, float]:
    """Least-squares (a, b) of y = a + b x; through the origin for a single point."""
    if len(xs) == 1:
        return 0.0, ys[0] / xs[0]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / \
        sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b

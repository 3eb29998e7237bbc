"""Load-aware K: speculation that never costs more than it earns, whatever the load.

Lightly loaded, a target pass costs about the same for 5 tokens as for 1, so drafts are
nearly free. Under load the target batches every session's tokens into one pass whose
time grows with the tokens in it, and every rejected draft costs the whole system real
compute. This controller picks the K that maximises *goodput* (accepted tokens per
second of the resource that limits the round), the quantity TurboSpec (Liu et al.
2024, "TurboSpec: Closed-loop Speculation Control System for Optimizing LLM Serving
Goodput") controls, with the cost model of docs/design.md section 7 given a batch term.

Measured, shared by every generation of one coordinator (they share the services):

* the target's pass time as `t0 + t1 * tokens`, a least-squares line over recent passes
  (each VerifyResponse says the sessions, tokens and seconds of the pass that served
  it), and `B`, the sessions per pass;
* the draft's time per proposed token `d` (Propose latency / tokens, which includes
  the draft's own batching);
* the per-token acceptance `a`.

With every session drafting K, a session's Verify sits in a pass of about B (K + 1)
tokens: v(K) = t0 + t1 B (K + 1). A round yields (1 - a^(K+1)) / (1 - a) tokens and
costs K d + v(K) sequentially, or max((K+1) d, v(K)) pipelined when the guess holds
(probability ~a^(K+1)), as AdaptiveK's model. K = 0 costs t0 + t1 B and yields one
token. The K in [0, default K] with the most tokens per second wins once the target
batches (1.5 sessions per pass or more; alone, the default K is the measured best);
K = 0 means
target-only rounds, which is how speculation stops being slower than plain decoding
when the target is compute-bound. K then depends on timing, so a sampled generation
whose request leaves K to the server is exact in distribution but not bit-reproducible
under varying load; a request that sets num_draft_tokens pins K.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field

from coordinator.adaptive import ema

PASS_SAMPLES = 256
MIN_PASSES = 16  # passes seen before the fit is trusted
PROBE_EVERY = 16  # rounds at K = 0 drafted anyway now and then, to keep a and d fresh
# Below this many sessions per target pass the default K stands: it is the measured best
# for one stream (docs/benchmarks.md), and the model's pipelined cost is only rough.
LOADED_SESSIONS = 1.5
# Leave the default K only for a predicted gain of more than this: measured through the
# system, K=1 loses to both K=0 and K=4 at 8 and 32 streams although the model ranks it
# close to K=4 (docs/benchmarks.md, load).
MARGIN = 0.25


@dataclass
class TargetPasses:
    """The target's pass time against its tokens, fitted over recent passes."""

    samples: deque = field(default_factory=lambda: deque(maxlen=PASS_SAMPLES))

    def add(self, sessions: int, tokens: int, seconds: float) -> None:
        if sessions > 0 and tokens > 0 and seconds > 0:
            self.samples.append((sessions, tokens, seconds))

    def fit(self) -> tuple[float, float, float] | None:
        """(t0, t1, sessions per pass), or None until enough passes were seen."""
        if len(self.samples) < MIN_PASSES:
            return None
        n = len(self.samples)
        xs = [t for _, t, _ in self.samples]
        ys = [s for _, _, s in self.samples]
        mx, my = sum(xs) / n, sum(ys) / n
        var = sum((x - mx) ** 2 for x in xs)
        t1 = max(0.0, sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var) \
            if var > 0 else 0.0
        t0 = max(0.0, my - t1 * mx)
        if t0 == 0.0 and var == 0:
            t0 = my
        recent = list(self.samples)[-32:]
        sessions = sum(s for s, _, _ in recent) / len(recent)
        return t0, t1, sessions


class LoadAwareK:
    def __init__(self, k_max: int, pipelined: bool, smoothing: float = 0.1):
        self.k_max, self.pipelined, self.smoothing = max(0, k_max), pipelined, smoothing
        self.passes = TargetPasses()
        self.alpha: float | None = None
        self.draft_s_per_token: float | None = None
        self.zeros = 0  # rounds it chose K = 0 for
        self._lock = threading.Lock()

    def observe(self, k: int, accepted: int, rejected: bool, propose_s: float | None,
                proposed: int, pass_sessions: int, pass_tokens: int,
                pass_seconds: float, draft_step_s: float = 0.0) -> None:
        """One round of any generation of this coordinator. `draft_step_s`: the draft's
        own mean pass duration for the drafts (preferred: it holds for pre-drafts too and
        excludes waiting); else the fresh Propose's latency per token."""
        with self._lock:
            self.passes.add(pass_sessions, pass_tokens, pass_seconds)
            keep = 1 - self.smoothing
            trials = accepted + (1 if rejected else 0)
            if k > 0 and trials:
                self.alpha = ema(self.alpha, accepted / trials, keep)
            if draft_step_s > 0:
                self.draft_s_per_token = ema(self.draft_s_per_token, draft_step_s, keep)
            elif propose_s is not None and proposed > 0:
                self.draft_s_per_token = ema(self.draft_s_per_token, propose_s / proposed,
                                             keep)

    def choose(self, k_default: int) -> int:
        """The K for the next round, in [0, k_default]: the default K (the best measured
        without load) until the costs are measured, smaller when the load says so."""
        with self._lock:
            fit = self.passes.fit()
            if fit is None or self.alpha is None or self.draft_s_per_token is None \
                    or fit[2] < LOADED_SESSIONS:
                return k_default
            k_default = min(k_default, self.k_max)
            best = self.best(k_default, *fit)
            if self.goodput(best, *fit) < (1 + MARGIN) * self.goodput(k_default, *fit):
                best = k_default  # the model is rough: move only for a clear gain
            if best == 0:
                self.zeros += 1
                if self.zeros % PROBE_EVERY == 0:
                    best = 1  # keep measuring acceptance and draft cost
            return best

    def best(self, k_max: int, t0: float, t1: float, sessions: float) -> int:
        return max(range(k_max + 1), key=lambda k: self.goodput(k, t0, t1, sessions))

    def goodput(self, k: int, t0: float, t1: float, sessions: float) -> float:
        """Expected tokens per second of one session drafting k, all others alike."""
        verify = t0 + t1 * max(sessions, 1.0) * (k + 1)
        if k == 0:
            return 1.0 / verify
        a = min(self.alpha or 0.0, 0.999)
        tokens = (1 - a ** (k + 1)) / (1 - a)
        d = self.draft_s_per_token or 0.0
        sequential = k * d + verify
        if not self.pipelined:
            return tokens / sequential
        held = a ** (k + 1)
        return tokens / (held * max((k + 1) * d, verify) + (1 - held) * sequential)

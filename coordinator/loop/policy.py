"""How the loop runs rounds: the one place that defines the coordinator's defaults.

The defaults are the best loop measured (docs/benchmarks.md): pipelined drafting at
K = 4, load-aware K under concurrency, no adaptive K, no confidence exit.
`python -m coordinator`, the Serve application builder (and so the k8s RayService),
`specdec up` and the benchmarks all start from `LoopPolicy()`.
"""

from __future__ import annotations

from dataclasses import dataclass

from coordinator.drafters.costs import LookupSettings


@dataclass(frozen=True)
class LoopPolicy:
    k: int = 4  # draft tokens per round when a request does not say
    pipeline: bool = True  # pre-draft round r+1 while round r is verified
    prefill_overlap: bool = True  # pipelined: round 1 overlaps the two prefills
    adaptive_k: bool = False  # choose K per round (coordinator.drafters.adaptive.AdaptiveK)
    # K from the measured batched costs when a request leaves K to the server
    # (coordinator.load.LoadAwareK): shrinks to 0 when the target is compute-bound.
    load_aware_k: bool = True
    confidence_exit: bool = False  # the draft stops a round once it is unsure
    exit_threshold: float = 0.3  # the confidence exit's starting threshold
    exit_target_acceptance: float = 0.8  # the acceptance the exit steers towards
    top_n: int = 0  # sparse q size per drafted token; 0 = the draft's default
    # Who drafts (coordinator.drafters.costs): "model", "lookup" (model-free, needs no draft
    # service) or "hybrid" (per round, whichever is expected to give more tokens/s).
    drafter: str = "hybrid"
    lookup_k: int = LookupSettings.max_tokens  # drafts per look-up round at most
    lookup_min_match: int = LookupSettings.min_match  # hybrid: this long a match looks up
    lookup_cache: int = 0  # recent outputs kept per tenant for the look-up; 0 = off
    # Sampled pipelined rounds: the target draws the bonus and the draft its guess at it
    # with the same Gumbel noise (specdec.coupling), so pre-drafts hold more often.
    couple_bonus: bool = True


DEFAULT_POLICY = LoopPolicy()

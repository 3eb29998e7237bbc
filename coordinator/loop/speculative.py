"""SpeculativeLoop: the coordinator's loop over draft and target replicas, per generation.

A generation is rounds of propose -> verify -> decide (the pure math of specdec.verify)
until max_new_tokens or an end-of-sequence token. K = 0 is target-only decoding through
the same Verify, so both paths share everything but the draft. `rounds()` yields each
round's tokens; the rounds themselves run in the replica's lockstep engine
(coordinator.loop.engine), one step for every live generation at once. Contrastive
generations run their own loop (coordinator.loop.contrastive).

The parts, each with one job:
  coordinator.loop.engine      the steps: every generation's round at once
  coordinator.loop.generation  one generation's state and its part of a step
  coordinator.loop.calls       a step's batch calls, items isolated, failures repaired
  coordinator.loop.plan        K per generation and step, from what a step costs
  coordinator.loop.costs       what a step costs, measured
  coordinator.loop.calibration what steps delivered of their prediction, measured
  coordinator.loop.acceptance  what a generation's drafts are worth
  coordinator.drafters         who drafts: the draft model, the look-up, the hybrid
  coordinator.remote.link             a generation's link to each service (pins, cache views)
  coordinator.record           every event counted once, in LoopStats and LoopMetrics
  coordinator.loop.policy           how rounds run, and the coordinator's defaults
Greedy output is the target's alone, with or without faults, pipelining or any K.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from coordinator.drafters.adaptive import ConfidenceExit
from coordinator.drafters.base import LOOKUP, MODEL
from coordinator.drafters.costs import LookupSettings
from coordinator.drafters.hybrid import HybridDrafter
from coordinator.drafters.lookup import LookupDrafter
from coordinator.drafters.model import ModelDrafter
from coordinator.drafters.prediction import Prediction
from coordinator.drafters.trie import OutputCache
from coordinator.loop.contrastive import contrastive_rounds
from coordinator.loop.engine import Engine
from coordinator.loop.generation import Generation, Shared
from coordinator.loop.plan import Planner
from coordinator.loop.policy import DEFAULT_POLICY, LoopPolicy
from coordinator.loop.round import RoundOutput
from coordinator.record import LoopStats
from coordinator.remote.clients import DraftClient, TargetClient
from coordinator.remote.routing import Router
from specdec.contrastive import ContrastiveParams
from specdec.metrics import LoopMetrics
from specdec.sampling import SamplingParams
from specdec.verify import TokenKind

__all__ = ["LoopResult", "LoopStats", "RoundOutput", "SpeculativeLoop"]


@dataclass
class LoopResult:
    token_ids: list[int]
    kinds: list[TokenKind]
    finish_reason: str  # "length" | "eos"
    stats: LoopStats


class SpeculativeLoop:
    def __init__(self, draft: Router | DraftClient | None, target: Router | TargetClient,
                 policy: LoopPolicy = DEFAULT_POLICY, metrics: LoopMetrics | None = None,
                 max_propose: int = 16, draft_backoff_s: float = 1.0,
                 max_concurrency: int = 32, max_verify: int = 16):
        self.policy = policy
        self.max_propose = max_propose  # the draft's max_draft_tokens (K+1 when pipelining)
        self.max_verify = max_verify  # the target's max_draft_tokens (a look-up's cap)
        self.lookup = LookupSettings(max_tokens=min(policy.lookup_k, max_verify),
                                     min_match=policy.lookup_min_match)
        # The tenants' recent outputs, shared by this replica's generations (opt-in).
        self.output_cache = OutputCache(policy.lookup_cache, self.lookup.depth) \
            if policy.lookup_cache > 0 else None
        self.draft = _as_router(draft, "draft") if draft is not None else None
        self.target = _as_router(target, "target")
        self.draft_backoff_s = draft_backoff_s
        self._metrics = metrics if metrics is not None else LoopMetrics()
        # Contrastive generations pre-draft and score beside their Verify in threads.
        self.executor = ThreadPoolExecutor(max_workers=max(1, max_concurrency),
                                           thread_name_prefix="predraft") \
            if policy.pipeline and draft is not None else None
        self.amateur_pool = ThreadPoolExecutor(max_workers=max(1, max_concurrency),
                                               thread_name_prefix="amateur") \
            if draft is not None else None
        self.planner = Planner(policy.k, self.k_max,
                               adaptive=policy.load_aware_k or policy.adaptive_k)
        self.shared = Shared(self.draft, self.target, policy, self._metrics, self._drafter,
                             draft_backoff_s, self.k_max)
        self.engine = Engine(self.planner, policy.pipeline, metrics=lambda: self._metrics)

    @property
    def metrics(self) -> LoopMetrics:
        return self._metrics

    @metrics.setter
    def metrics(self, metrics: LoopMetrics) -> None:
        """Metrics are swapped in after start-up (coordinator.deploy.app, tests)."""
        self._metrics = metrics
        self.shared.metrics = metrics

    @property
    def k_max(self) -> int:
        """The most drafts a model-drafted round can verify: the draft's max, less the
        pipelined guess (the target's, when there is no draft)."""
        if self.draft is None:
            return self.max_verify if self.drafts_by_lookup else 0
        return self.max_propose - (1 if self.policy.pipeline else 0)

    @property
    def drafts_by_lookup(self) -> bool:
        """Rounds may be drafted by the look-up (--drafter lookup or hybrid)."""
        return self.policy.drafter != MODEL and self.policy.lookup_k > 0

    def _drafter(self, gen: Generation):
        """The drafter of a speculative generation, from --drafter and what is there."""
        p = self.policy
        model = None
        if gen.draft is not None and p.drafter != LOOKUP:
            exit_ = ConfidenceExit(p.exit_threshold, p.exit_target_acceptance) \
                if p.confidence_exit else None
            model = ModelDrafter(gen.draft, gen.sampling, gen.record, self.max_propose,
                                 p.top_n, exit_)
        prediction = Prediction(gen.prediction, gen.prompt_len, self.max_verify) \
            if gen.prediction else None
        if not self.drafts_by_lookup and prediction is None:
            return model
        lookup = LookupDrafter(gen.committed.tokens, self.lookup, gen.sampling.greedy,
                               self.output_cache if self.drafts_by_lookup else None,
                               gen.tenant, gen.k, prediction)
        gen.lookup = lookup
        return lookup if model is None else HybridDrafter(model, lookup, self.lookup)

    def rounds(self, prompt_ids: Sequence[int], max_new_tokens: int, sampling: SamplingParams,
               num_draft_tokens: int, eos_token_ids: Sequence[int] = (),
               stats: LoopStats | None = None, load_aware: bool = False,
               contrastive: ContrastiveParams | None = None, tenant: str | None = None,
               logprobs: int | None = None, prompt_logprobs: bool = False,
               prediction: Sequence[int] = (), guide=None,
               ) -> Iterator[RoundOutput]:
        """Run a generation round by round. Closing the iterator early (a stop string,
        a cancelled client) releases both sessions at once. `load_aware`: K was left to
        the server, so the planner chooses it each step (at most num_draft_tokens);
        otherwise num_draft_tokens is the K of every round (unless --adaptive-k).
        `contrastive`: contrastive decoding (coordinator.loop.contrastive_round) with a fixed
        K (0 = the plain form); it needs the draft. `tenant`: whose recent outputs the
        look-up may draft from and add this output to (when the output cache is on);
        None = neither. `logprobs`: each token's raw log-probability and this many top
        alternatives (RoundOutput.logprobs); `prompt_logprobs`: the prompt's too.
        `prediction`: the token ids the output is expected to resemble (Predicted
        Outputs): the look-up drafts from them first (coordinator.drafters.prediction).
        `guide`: a matcher of sampling.grammar for this generation
        (specdec.grammar.Grammars.new_state; the services mask with the grammar either
        way): with it, what the grammar forces is committed without a pass
        (jump-forward) and look-up drafts stop where the grammar refuses them."""
        if contrastive is not None:
            yield from contrastive_rounds(self, prompt_ids, max_new_tokens, sampling,
                                          num_draft_tokens, eos_token_ids, stats,
                                          load_aware, contrastive)
            return
        speculative = num_draft_tokens > 0 and (
            self.draft is not None or self.drafts_by_lookup or bool(prediction))
        gen = Generation(self.shared, list(prompt_ids), max_new_tokens, sampling,
                         num_draft_tokens if speculative else 0, eos_token_ids, stats,
                         speculative, tenant if speculative else None,
                         fixed_k=not (load_aware or self.policy.adaptive_k),
                         logprobs=logprobs, prompt_logprobs=prompt_logprobs,
                         prediction=prediction if speculative else (), guide=guide)
        gen.record.started()
        self.engine.join(gen)
        try:
            while True:
                out = gen.outputs.get()
                if isinstance(out, BaseException):
                    raise out
                yield out
                if out.finish_reason:
                    return
        finally:
            if not gen.closed.is_set():
                self.engine.leave(gen)
            gen.finalize()

    def generate(self, prompt_ids: Sequence[int], max_new_tokens: int,
                 sampling: SamplingParams, num_draft_tokens: int,
                 eos_token_ids: Sequence[int] = (),
                 on_tokens: Callable[[list[int], list[TokenKind]], None] | None = None,
                 contrastive: ContrastiveParams | None = None, guide=None) -> LoopResult:
        stats = LoopStats()
        ids: list[int] = []
        kinds: list[TokenKind] = []
        reason = "length"
        for out in self.rounds(prompt_ids, max_new_tokens, sampling, num_draft_tokens,
                               eos_token_ids, stats, contrastive=contrastive,
                               guide=guide):
            ids += out.tokens
            kinds += out.kinds
            if on_tokens:
                on_tokens(out.tokens, out.kinds)
            reason = out.finish_reason or reason
        return LoopResult(ids, kinds, reason, stats)

    def close(self) -> None:
        self.engine.close()


def _as_router(x, name: str) -> Router:
    return x if isinstance(x, Router) else Router.from_clients({f"{name}-0": x})

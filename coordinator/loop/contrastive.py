"""Contrastive generations: their own round loop, beside the lockstep engine.

A contrastive round (coordinator.loop.contrastive_round) needs three calls in order (the
amateur's Propose, the expert's Verify with V_head, the amateur's Score on V_head), so it
runs per generation in the caller's thread, as every round did before the lockstep
engine. Its forward passes still share the services' passes with everyone else's
(specdec.runtime.batching). K is fixed, or (left to the server or --adaptive-k) chosen
per generation by AdaptiveK, whose plain form (K = 0) competes.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Sequence

from coordinator.drafters.adaptive import AdaptiveK
from coordinator.loop.contrastive_round import contrastive_round
from coordinator.loop.predraft import PreDrafts
from coordinator.loop.round import RoundOutput
from coordinator.record import LoopStats, Recorder
from coordinator.remote.clients import WireBytes
from coordinator.remote.link import DraftLink, TargetLink
from coordinator.remote.routing import Pins
from specdec.contrastive import ContrastiveParams
from specdec.digest import TokenPrefix
from specdec.errors import FailedPrecondition, Unavailable
from specdec.sampling import SamplingParams, generator


class ContrastiveGeneration:
    """What contrastive_round needs of a generation: its ids, links, pre-drafts, record
    and random streams."""

    def __init__(self, loop, prompt: list[int], sampling: SamplingParams, k_max: int,
                 stats: LoopStats | None):
        self.loop, self.policy, self.sampling = loop, loop.policy, sampling
        self.committed = TokenPrefix(prompt)
        self.generated = 0
        self.session_id = uuid.uuid4().hex
        self.uniforms = generator(sampling.seed, "uniforms")
        self.round_index = 0
        self.record = Recorder(stats if stats is not None else LoopStats(), loop.metrics,
                               k_max)
        self.meter = WireBytes()
        self.pins = Pins()
        self.target = TargetLink(loop.target, self.pins, self.session_id, self.record,
                                 self.meter)
        if not self.target.pin():
            raise Unavailable("no target replica is reachable; retry later")
        self.draft = DraftLink(loop.draft, self.pins, self.session_id, self.record,
                               self.meter, loop.draft_backoff_s)
        self.predrafts = PreDrafts(loop.executor, self.draft, self.record, sampling,
                                   self.policy.top_n) if loop.executor is not None else None

    def release(self) -> None:
        if self.predrafts is not None:
            self.predrafts.drop()  # a busy draft session is freed when its request returns
        self.pins.release_all(self.session_id)


def contrastive_rounds(loop, prompt_ids: Sequence[int], max_new_tokens: int,
                       sampling: SamplingParams, k: int, eos_token_ids: Sequence[int],
                       stats: LoopStats | None, load_aware: bool,
                       params: ContrastiveParams) -> Iterator[RoundOutput]:
    """A contrastive generation round by round (closing it early releases both
    sessions at once)."""
    if loop.draft is None:
        raise FailedPrecondition("contrastive decoding needs a draft service (the "
                                 "amateur); this coordinator runs target-only")
    k_max = loop.k_max
    adaptive = AdaptiveK(max(1, k_max), k, loop.policy.pipeline, k_min=0) \
        if k > 0 and (loop.policy.adaptive_k or load_aware) else None
    gen = ContrastiveGeneration(loop, list(prompt_ids), sampling,
                                max(k, adaptive.k_max if adaptive else 0), stats)
    gen.record.started()
    t0 = time.perf_counter()
    between, round_end = 0.0, None
    try:
        while True:
            remaining = max_new_tokens - gen.generated
            started = time.perf_counter()
            if round_end is not None:
                between = started - round_end
            gen.round_index += 1
            result = contrastive_round(gen, min(adaptive.k if adaptive else k, remaining - 1),
                                       remaining, params)
            gen.record.round(result, time.perf_counter() - started)
            round_end = time.perf_counter()
            if adaptive is not None and gen.round_index > 1:
                # Its plain form competes, at three calls per token: the whole cycle
                # beyond drafting counts, not the Verify alone (a round's fixed cost would
                # otherwise make K = 0 look cheaper than it is).
                verify_s = round_end - started - (result.propose_s or 0.0) - \
                    result.predraft_wait_s + between
                adaptive.observe(result.k, result.decision.num_accepted, result.rejected,
                                 result.propose_s, verify_s, result.proposed)
            tokens = result.decision.tokens[:remaining]
            kinds = result.decision.kinds[:remaining]
            stop = next((i for i, t in enumerate(tokens) if t in eos_token_ids), None)
            if stop is not None:
                tokens, kinds = tokens[: stop + 1], kinds[: stop + 1]
            gen.committed.extend(tokens)
            gen.generated += len(tokens)
            gen.record.committed(len(tokens))
            reason = "eos" if stop is not None else (
                "length" if gen.generated >= max_new_tokens else None)
            gen.record.stats.seconds = time.perf_counter() - t0
            yield RoundOutput(tokens, kinds, reason)
            if reason:
                return
    finally:
        gen.release()
        gen.record.finished(time.perf_counter() - t0, gen.meter.sent, gen.meter.received)

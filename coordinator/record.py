"""One generation's record: LoopStats (per generation) and LoopMetrics (process-wide).

Every event is recorded once, here, and lands in both: the generation's LoopStats (sent
to the client with the last chunk) and the loop's LoopMetrics (Prometheus; a null object
unless the coordinator serves --metrics-port).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specdec.metrics import LoopMetrics
from specdec.verify import Decision


@dataclass
class LoopStats:
    rounds: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    rejections: int = 0  # rounds that ended in a recovered token
    resyncs: int = 0  # re-prefills after FAILED_PRECONDITION / NOT_FOUND
    draft_fallbacks: int = 0  # rounds decoded target-only because the draft failed
    target_repins: int = 0
    k_per_round: list[int] = field(default_factory=list)  # the K each round used
    predrafts_started: int = 0  # pre-drafts sent (each is then used or wasted)
    pipelined_rounds: int = 0  # rounds whose drafts were pre-drafted during the last Verify
    predrafts_wasted: int = 0  # pre-drafts thrown away (a rejection or another bonus)
    confidence_exits: int = 0  # rounds the draft cut short (confidence below the threshold)
    bytes_sent: int = 0
    bytes_received: int = 0
    seconds: float = 0.0
    accepted_per_position: list[int] = field(default_factory=list)
    head_positions: int = 0  # contrastive: positions whose V_head was scored
    head_ids: int = 0  # contrastive: the ids of those V_heads, summed
    # Rounds drafted by the model-free look-up (coordinator.drafters.trie), and their drafts;
    # included in rounds, drafted_tokens and accepted_tokens above.
    lookup_rounds: int = 0
    lookup_drafted_tokens: int = 0
    lookup_accepted_tokens: int = 0
    # Predicted Outputs: the prediction's length, and the drafts taken from it (their
    # rounds are neither in lookup_* nor model rounds; they are in the totals above).
    prediction_tokens: int = 0
    prediction_drafted_tokens: int = 0
    prediction_accepted_tokens: int = 0
    # Structured outputs' jump-forward: tokens the grammar forced (the only one it
    # allowed), committed without a model pass; included in the generated tokens.
    forced_tokens: int = 0
    # Rounds that started an all-accepted pre-draft, by outcome: a draft rejected, or all
    # accepted and the bonus not the draft's guess (either way that pre-draft misses).
    guess_rounds: int = 0
    guess_rejections: int = 0
    guess_bonus_misses: int = 0
    # The drafting decision: the K chosen for each round (coordinator.loop.plan; the
    # request's when it set K), summed, and why it was 0 when it was: reason class ->
    # [rounds, the latest wording].
    planned_rounds: int = 0
    planned_k_sum: int = 0
    k_reasons: dict = field(default_factory=dict)
    # The replicas the generation was pinned to, in order (a re-pin adds one).
    draft_replicas: list[str] = field(default_factory=list)
    target_replicas: list[str] = field(default_factory=list)

    @property
    def mean_k(self) -> float:
        """The K chosen per round, on average (rounds after a missed pre-draft verify
        fewer drafts: k_per_round has what each round verified)."""
        return self.planned_k_sum / self.planned_rounds if self.planned_rounds else 0.0

    @property
    def k_reason(self) -> str:
        """Why K was 0 in the rounds where it was, most frequent first ("" if never)."""
        parts = sorted(self.k_reasons.values(), key=lambda x: -x[0])
        return "; ".join(f"K=0 in {n} of {self.planned_rounds} rounds: {text}"
                         for n, text in parts)

    @property
    def mean_head_size(self) -> float:
        return self.head_ids / self.head_positions if self.head_positions else 0.0


@dataclass(frozen=True)
class RoundResult:
    """What one round did: its decision, how many drafts it verified, and its latencies."""

    decision: Decision
    k: int  # drafts verified (0: a target-only round)
    verify_s: float
    propose_s: float | None = None  # None when the drafts were pre-drafted (or none)
    proposed: int = 0  # tokens that fresh Propose drafted (K, or K+1 when pipelining)
    exited_early: bool = False  # the draft's confidence exit cut the proposal short
    # The target pass that served the Verify: sessions, tokens, seconds (0s = unknown).
    target_pass: tuple[int, int, float] = (0, 0, 0.0)
    draft_step_s: float = 0.0  # the draft's mean pass duration for these drafts (0 = unknown)
    predraft_wait_s: float = 0.0  # waited for the pre-draft that supplied the drafts
    source: str = "model"  # the drafter that supplied the drafts: model|lookup|prediction

    @property
    def rejected(self) -> bool:
        return self.decision.num_accepted < self.k


class Recorder:
    def __init__(self, stats: LoopStats, metrics: LoopMetrics, k_max: int):
        self.stats, self.metrics = stats, metrics
        stats.accepted_per_position = [0] * max(k_max, 0)

    def started(self) -> None:
        self.metrics.generation_started()

    def finished(self, seconds: float, sent: int, received: int) -> None:
        self.metrics.generation_finished()
        self.stats.seconds = seconds
        self.stats.bytes_sent, self.stats.bytes_received = sent, received

    def heads(self, sizes: list[int]) -> None:
        """A contrastive round scored V_heads of these sizes."""
        self.stats.head_positions += len(sizes)
        self.stats.head_ids += sum(sizes)
        self.metrics.heads(sizes)

    def round(self, result: RoundResult, seconds: float) -> None:
        s = self.stats
        s.rounds += 1
        s.k_per_round.append(result.k)
        self.metrics.round(seconds, result.k)
        if result.exited_early:
            s.confidence_exits += 1
            self.metrics.confidence_exit()
        if result.k:
            accepted = result.decision.num_accepted
            s.drafted_tokens += result.k
            s.accepted_tokens += accepted
            s.rejections += result.rejected
            if accepted > len(s.accepted_per_position):  # a look-up may draft more than K
                s.accepted_per_position += [0] * (accepted - len(s.accepted_per_position))
            for i in range(accepted):
                s.accepted_per_position[i] += 1
            if result.source == "lookup":
                s.lookup_rounds += 1
                s.lookup_drafted_tokens += result.k
                s.lookup_accepted_tokens += accepted
            elif result.source == "prediction":
                s.prediction_drafted_tokens += result.k
                s.prediction_accepted_tokens += accepted
            self.metrics.drafted(result.k, accepted)
            self.metrics.drafter(result.source, result.k, accepted)

    def planned(self, k: int, reason: str) -> None:
        """A round's K as chosen, and why it is 0 when it is (the reason's class is its
        wording up to the first figure)."""
        s = self.stats
        s.planned_rounds += 1
        s.planned_k_sum += k
        if k == 0 and reason:
            cls = next((reason[:i] for i, ch in enumerate(reason) if ch.isdigit()), reason)
            entry = s.k_reasons.setdefault(cls, [0, reason])
            entry[0] += 1
            entry[1] = reason

    def committed(self, tokens: int) -> None:
        self.metrics.generated(tokens)

    def rpc(self, name: str, seconds: float) -> None:
        self.metrics.rpc(name, seconds)

    def resync(self, name: str) -> None:
        self.stats.resyncs += 1
        self.metrics.resync(name)

    def draft_fallback(self) -> None:
        self.stats.draft_fallbacks += 1
        self.metrics.draft_fallback()

    def target_repin(self) -> None:
        self.stats.target_repins += 1
        self.metrics.target_repin()

    def outcome(self, rejected: bool, other_bonus: bool) -> None:
        """A round that started an all-accepted pre-draft: how it ended."""
        self.stats.guess_rounds += 1
        self.stats.guess_rejections += rejected
        self.stats.guess_bonus_misses += (not rejected) and other_bonus

    def pinned(self, rpc: str, address: str) -> None:
        """The generation was pinned to the replica at `address` of the draft
        ("propose") or the target ("verify")."""
        (self.stats.draft_replicas if rpc == "propose" else
         self.stats.target_replicas).append(address)

    def predraft_started(self) -> None:
        self.stats.predrafts_started += 1

    def predraft(self, used: bool) -> None:
        if used:
            self.stats.pipelined_rounds += 1
        else:
            self.stats.predrafts_wasted += 1
        self.metrics.predraft(used)

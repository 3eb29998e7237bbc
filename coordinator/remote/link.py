"""One generation's link to one service: its pinned replica, what its session cache holds,
and the cache-sync calls with their resync and failover rules.

Every call is planned from the link's CacheView with the sync formula
(coordinator.remote.view), and on success the view becomes what the server's reply says it
holds (`cached_len`). A resync error (FAILED_PRECONDITION, NOT_FOUND) is answered from
what the server said in its trailing metadata: when it holds fewer positions than the
request kept, the view is cut to those and the call repeated, which costs only the
missing tail; otherwise (another prefix, or no session) the view is forgotten and the
call re-prefills from the committed ids. A second resync error always re-prefills.

Failover differs by role. A failing draft never fails a generation: the link reports
the failure, the loop decodes target-only, and the link tries again after an
exponential back-off (on another replica if that one is down). A failing target is
replaced by another replica, which re-prefills and repeats the round with the same
round seed; with none left the generation fails with UNAVAILABLE.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

import grpc

from coordinator.record import Recorder
from coordinator.remote.clients import Heads, Proposal, WireBytes, cached_len_of
from coordinator.remote.routing import Pins, Router, backoff_s
from coordinator.remote.view import CacheView
from specdec.contrastive import ContrastiveParams
from specdec.digest import TokenPrefix
from specdec.errors import InvalidArgument, ResourceExhausted, Unavailable
from specdec.propose import ProposeOptions
from specdec.sampling import SamplingParams
from specdec.sync import SyncRequest
from specdec.verify import TargetRound

log = logging.getLogger(__name__)

RESYNC_CODES = (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.NOT_FOUND)
DRAFT_DOWN_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)

T = TypeVar("T")


class AmateurUnavailable(Unavailable):
    """The draft failed a contrastive call (or none is reachable)."""


class Link:
    """The replica a generation is pinned to for one service, and its cache view."""

    rpc_name = ""  # labels the call's metrics: "propose" or "verify"

    def __init__(self, router: Router, pins: Pins, session_id: str, record: Recorder,
                 meter: WireBytes):
        self.router, self.pins, self.session_id = router, pins, session_id
        self.record, self.meter = record, meter
        self.replica = None
        self.view = CacheView()

    def pin(self, exclude: list[str] | tuple = ()) -> bool:
        """Pin to another replica (a fresh session there: the view starts empty)."""
        replica = self.pins.acquire(self.router, exclude)
        if replica is None:
            return False
        self.replica, self.view = replica, CacheView()
        self.record.pinned(self.rpc_name, replica.address)
        return True

    def plan(self, committed: TokenPrefix, min_new: int = 1) -> SyncRequest:
        keep_len, keep_digest, new_tokens = self.view.plan(committed, min_new)
        return SyncRequest(self.session_id, keep_len, keep_digest, new_tokens)

    def call(self, committed: TokenPrefix, rpc: Callable[[object, SyncRequest], T],
             min_new: int = 1) -> T:
        """rpc(client, sync) with the planned sync, resynced as the module says."""
        resynced = partial = False
        while True:
            sync = self.plan(committed, min_new)
            started = time.perf_counter()
            try:
                return rpc(self.replica.client, sync)
            except grpc.RpcError as e:
                if e.code() not in RESYNC_CODES or (resynced and not partial):
                    raise
                self.record.resync(self.rpc_name)
                held = cached_len_of(e)
                partial = not resynced and e.code() == grpc.StatusCode.FAILED_PRECONDITION \
                    and held is not None and held < sync.keep_len
                resynced = True
                if partial:
                    self.view.truncate(held)
                else:
                    self.view.forget()
            finally:
                self.record.rpc(self.rpc_name, time.perf_counter() - started)


class DraftLink(Link):
    rpc_name = "propose"

    def __init__(self, router: Router, pins: Pins, session_id: str, record: Recorder,
                 meter: WireBytes, backoff_base_s: float):
        super().__init__(router, pins, session_id, record, meter)
        self.backoff_base_s = backoff_base_s
        self.failures = 0
        self.retry_at = 0.0
        self.failed_address: str | None = None

    def ready(self) -> bool:
        """Pinned and out of back-off: the pinned draft, or a new one once the back-off
        after a failure is over (or when its pod left the pool)."""
        if time.monotonic() < self.retry_at:
            return False
        if self.replica is not None and not self.router.is_live(self.replica):
            self.replica = None  # its pod left the pool: pick another
        return self.replica is not None or self.pin()

    def failed(self, error: grpc.RpcError) -> None:
        self.failed_with(error.code(), error.details())

    def failed_with(self, code: grpc.StatusCode, details: str) -> None:
        """The pinned draft failed a call with `code`: back off (and, when it is down,
        re-pin after the back-off); the view is forgotten, so the next call
        re-prefills."""
        log.warning("draft %s failed (%s: %s); decoding target-only for now",
                    self.replica.address if self.replica else "-", code.name, details)
        if self.replica is not None:
            self.failed_address = self.replica.address
            if code in DRAFT_DOWN_CODES:
                self.router.mark_failed(self.replica, once_per_outage=True)
                self.replica = None  # re-pin (maybe elsewhere) after the back-off
        self.view.forget()
        self.record.draft_fallback()
        self.failures += 1
        self.retry_at = time.monotonic() + backoff_s(self.backoff_base_s, self.failures, 5)

    def propose(self, committed: TokenPrefix, sampling: SamplingParams,
                options: ProposeOptions) -> Proposal | None:
        """options.num_tokens tokens from the draft on top of the committed ids; None while
        it is failing."""
        if not self.ready():
            return None
        try:
            proposal = self.call(committed, lambda client, sync: client.propose(
                sync, sampling, options, self.meter))
        except grpc.RpcError as e:
            self.failed(e)
            return None
        self.failures = 0
        self.view.served(committed.tokens + proposal.tokens, proposal.cached_len)
        return proposal


    def repin_now(self) -> bool:
        """Contrastive decoding cannot decode without its amateur, so it does not wait out
        the back-off: pin another replica now (a fresh session there). False if none."""
        if self.pin([self.failed_address] if self.failed_address else []):
            self.retry_at = 0.0
            return True
        return False

    def score(self, seq: TokenPrefix, heads: list, params: ContrastiveParams,
              min_new: int = 0) -> list:
        """The amateur's values on each head's ids, for the last len(heads) positions of
        `seq` (no heads: feed what the draft lacks and keep its logits). Contrastive
        decoding cannot go on without the amateur, so a failure is UNAVAILABLE."""
        if not self.ready():
            raise AmateurUnavailable("contrastive decoding needs the draft service (the "
                                     "amateur), and no draft replica is reachable; retry "
                                     "later")
        try:
            values, cached_len, _ = self.call(seq, lambda client, sync: client.score(
                sync, heads, params, self.meter), min_new=min_new)
        except grpc.RpcError as e:
            self.failed(e)
            raise AmateurUnavailable(f"the draft service (the amateur of contrastive "
                                     f"decoding) failed: {e.code().name}: {e.details()}") from e
        self.view.served(seq.tokens, cached_len)
        return values

    def score_read_only(self, seq: TokenPrefix, heads: list,
                params: ContrastiveParams) -> tuple[list, int | None] | None:
        """A read-only Score at `seq` (its last len(heads) positions), beside a pre-draft
        that may still hold the session; the view is left to that pre-draft. Returns the
        values and the pre-draft's next token (its guess at the bonus) if known. None when
        the draft does not hold `seq` now (evicted, or busy past the deadline): the caller
        takes the pre-draft out of the way and scores as usual."""
        if self.replica is None:
            return None
        sync = SyncRequest(self.session_id, len(seq), seq.digest_of(len(seq)), [])
        started = time.perf_counter()
        try:
            values, _, guess = self.replica.client.score(sync, heads, params, self.meter,
                                                         read_only=True)
            return values, guess
        except grpc.RpcError as e:
            if e.code() in RESYNC_CODES + (grpc.StatusCode.ABORTED,):
                return None
            self.failed(e)
            raise AmateurUnavailable(f"the draft service (the amateur of contrastive "
                                     f"decoding) failed: {e.code().name}: {e.details()}") from e
        finally:
            self.record.rpc(self.rpc_name, time.perf_counter() - started)


class TargetLink(Link):
    rpc_name = "verify"

    def leave_if_gone(self) -> None:
        """The pinned replica's pod is going away (e.g. a rollout): move now, while it
        still answers (a fresh session on the new one)."""
        if not self.router.is_live(self.replica):
            leaving = self.replica.address
            if self.pin([leaving]):
                log.info("target %s left the pool; re-pinned to %s", leaving,
                         self.replica.address)
                self.record.target_repin()

    def repin(self, code: grpc.StatusCode, details: str, tried: list[str]) -> None:
        """The pinned replica failed a call: back it off and pin another one not in
        `tried` (which this extends); UNAVAILABLE when none is left."""
        log.warning("target %s failed (%s: %s); re-pinning", self.replica.address,
                    code.name, details)
        self.router.mark_failed(self.replica, once_per_outage=True)
        tried.append(self.replica.address)
        if not self.pin(tried):
            raise Unavailable(f"no target replica left to continue the generation (tried "
                              f"{', '.join(tried)}; last error {code.name}: {details})")
        self.record.target_repin()

    def verify(self, committed: TokenPrefix, drafts: list[int], dists: list,
               sampling: SamplingParams, round_seed: int,
               contrastive: ContrastiveParams | None = None,
               bonus_seed: int | None = None) -> TargetRound | Heads:
        """Verify on the pinned target; on failure re-pin and repeat (same round seed)."""
        self.leave_if_gone()
        tried: list[str] = []
        while True:
            try:
                result, cached_len = self.call(committed, lambda client, sync: client.verify(
                    sync, drafts, dists, sampling, round_seed, self.meter, contrastive,
                    bonus_seed))
                self.router.mark_ok(self.replica)
                self.view.served(committed.tokens + drafts, cached_len)
                return result
            except grpc.RpcError as e:
                code = e.code()
                if code == grpc.StatusCode.INVALID_ARGUMENT:
                    raise InvalidArgument(f"target refused the request: {e.details()}") from e
                if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
                    raise ResourceExhausted(f"target is full: {e.details()}") from e
                self.repin(code, e.details(), tried)

"""Typed clients for the draft and target services.

Protobuf stays here: the loop sees plain Python values. Every call has a deadline.
Wire sizes of requests and replies are counted, so the loop can report bytes per round.
"""

from __future__ import annotations

import random
import threading
import time
from collections import deque
from concurrent.futures import CancelledError, ThreadPoolExecutor
from dataclasses import dataclass, field

import grpc
import torch

from specdec import wire
from specdec.contrastive import ContrastiveParams, Head
from specdec.logprobs import logprobs_from_proto
from specdec.messages import message_from
from specdec.propose import ProposeOptions
from specdec.sampling import SamplingParams
from specdec.sync import SyncRequest
from specdec.v1 import common_pb2, draft_pb2, draft_pb2_grpc, target_pb2, target_pb2_grpc
from specdec.verify import TargetRound

DEFAULT_DEADLINE_S = 30.0


CACHED_LEN_KEY = "specdec-cached-len"  # trailing metadata of a cache-sync error


def cached_len_of(error: grpc.RpcError) -> int | None:
    """The positions the server said it holds when it refused a cache-sync request."""
    for key, value in error.trailing_metadata() or ():
        if key == CACHED_LEN_KEY:
            return int(value)
    return None


@dataclass
class Proposal:
    tokens: list[int]
    dists: list[common_pb2.SparseDist]  # kept as protobuf: forwarded to Verify untouched
    cached_len: int
    requested: int = 0  # num_tokens asked for; more than len(tokens) after a confidence exit
    step_seconds: float = 0.0  # the draft's mean pass duration for this Propose (0 = unknown)

    @property
    def exited_early(self) -> bool:
        return len(self.tokens) < self.requested

    def draft_prob(self, i: int) -> float:
        """q_i(x_i) (from either form of SparseDist, as the target reads it); 1.0 when
        greedy (no dists)."""
        if not self.dists:
            return 1.0
        return wire.dist_from_proto(self.dists[i], f"dists[{i}]").prob_of(self.tokens[i])


@dataclass(frozen=True)
class Heads:
    """A contrastive Verify's answer: V_head with the expert's values at each position,
    and the target pass that served it."""

    heads: list[Head]
    pass_sessions: int = 0
    pass_tokens: int = 0
    pass_seconds: float = 0.0


@dataclass(frozen=True)
class Call:
    request_bytes: int
    reply_bytes: int
    seconds: float


@dataclass
class WireBytes:
    """Serialized bytes sent and received in total, and the most recent calls."""

    sent: int = 0
    received: int = 0
    recent: deque[Call] = field(default_factory=lambda: deque(maxlen=10_000))
    # Pre-drafts report from worker threads while the loop reports from its own.
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, request, response, started: float) -> None:
        """One call, timed from `started`: counted and kept among the recent calls."""
        call = Call(request.ByteSize(), response.ByteSize(), time.perf_counter() - started)
        with self._lock:
            self.recent.append(call)
            self.sent += call.request_bytes
            self.received += call.reply_bytes

    def count(self, request, response) -> None:
        """One exchange's bytes, counted in the totals only (an item of a batch call)."""
        with self._lock:
            self.sent += request.ByteSize()
            self.received += response.ByteSize()


class Cancel:
    """A handle to call off an RPC made in another thread (a pre-draft nobody needs)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._call: grpc.Future | None = None
        self.requested = False

    def attach(self, call: grpc.Future) -> None:
        with self._lock:
            self._call = call
            if self.requested:
                call.cancel()

    def __call__(self) -> None:
        with self._lock:
            self.requested = True
            if self._call is not None:
                self._call.cancel()


@dataclass(frozen=True)
class ItemFailure:
    """One failed item of a batch call (common.proto ItemError), or every item of a
    batch call that failed as a whole (then `whole` is true)."""

    code: grpc.StatusCode
    message: str
    cached_len: int | None = None
    whole: bool = False


_CODES = {c.value[0]: c for c in grpc.StatusCode}


class BatchCall:
    """A batch call in flight: `outcomes()` waits and gives, per item in order, its
    response message or an ItemFailure."""

    def __init__(self, future, request, field: str, bytes_total: WireBytes | None = None):
        self.future, self.request, self.field = future, request, field
        self.bytes_total = bytes_total
        self.started = time.perf_counter()
        self.finished: float | None = None  # when the answer came (set by the caller)
        self.seconds = 0.0  # the call's wall time, once done

    def done(self) -> bool:
        return self.future.done()

    def cancel(self) -> None:
        self.future.cancel()

    def _elapsed(self) -> float:
        """The call's wall time: to its answer, not to when the caller looked."""
        end = self.finished if self.finished is not None else time.perf_counter()
        return end - self.started

    def outcomes(self, timeout: float | None = None) -> list:
        """Wait at most `timeout` seconds (None: the call's deadline)."""
        n = len(self.request.items)
        try:
            resp = self.future.result(timeout=timeout)
        except (grpc.FutureTimeoutError, TimeoutError):
            self.future.cancel()
            self.seconds = self._elapsed()
            return [ItemFailure(grpc.StatusCode.DEADLINE_EXCEEDED,
                                f"no answer within {timeout:.1f} s", whole=True)] * n
        except grpc.RpcError as e:
            self.seconds = self._elapsed()
            return [ItemFailure(e.code(), e.details() or "", whole=True)] * n
        except (grpc.FutureCancelledError, CancelledError):
            self.seconds = self._elapsed()
            return [ItemFailure(grpc.StatusCode.CANCELLED, "called off", whole=True)] * n
        self.seconds = self._elapsed()
        if self.bytes_total is not None:
            self.bytes_total.add(self.request, resp, self.started)
        if len(resp.items) != n:
            return [ItemFailure(grpc.StatusCode.INTERNAL, f"{len(resp.items)} answers to "
                                f"{n} items", whole=True)] * n
        out = []
        for item in resp.items:
            if item.WhichOneof("outcome") == self.field:
                out.append(getattr(item, self.field))
            else:
                e = item.error
                out.append(ItemFailure(_CODES.get(e.code, grpc.StatusCode.UNKNOWN), e.message,
                                       e.cached_len if e.HasField("cached_len") else None))
        return out


class _ModelServiceClient:
    """Info and Release, common to both model services.

    `inject_rtt_s` (plus up to `jitter_s` at random) emulates a service on another host:
    half of it is slept before a Propose/Verify and half after. Timing only: outputs
    never depend on it."""

    stub_class: type

    def __init__(self, channel: grpc.Channel, deadline_s: float = DEFAULT_DEADLINE_S,
                 inject_rtt_s: float = 0.0, jitter_s: float = 0.0):
        self.stub = self.stub_class(channel)
        self.deadline_s = deadline_s
        self.bytes = WireBytes()
        self.inject_rtt_s, self.jitter_s = inject_rtt_s, jitter_s
        self._jitter = random.Random()
        self._pool: ThreadPoolExecutor | None = None  # runs batch calls (`_batch`)

    def _network(self) -> None:
        """Half a round trip of injected latency (no-op by default)."""
        if self.inject_rtt_s or self.jitter_s:
            time.sleep((self.inject_rtt_s + self._jitter.uniform(0, self.jitter_s)) / 2)

    def _unary(self, method, req, meter: WireBytes | None, send=None):
        """One call with its injected latency and its bytes counted (in `meter` too);
        `send(req)` replaces the plain blocking call (Propose's cancellable one)."""
        started = time.perf_counter()
        self._network()
        resp = send(req) if send is not None else method(req, timeout=self.deadline_s)
        self._network()
        self.bytes.add(req, resp, started)
        if meter is not None:
            meter.add(req, resp, started)
        return resp

    def _batch(self, method, req, field: str) -> BatchCall:
        """Start a batch call: a blocking call in a thread of this client's (grpc's
        `.future()` starts a channel-polling thread whenever no call is in flight, which
        a step's calls, one after the other, paid every time)."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="batch")
        call = BatchCall(None, req, field)

        def run():
            try:
                return self._unary(method, req, None)
            finally:
                call.finished = time.perf_counter()

        call.future = self._pool.submit(run)
        return call

    def info(self, timeout: float | None = None) -> common_pb2.ModelInfo:
        return self.stub.Info(common_pb2.InfoRequest(), timeout=timeout or self.deadline_s)

    def release(self, session_id: str) -> bool:
        req = common_pb2.ReleaseRequest(session_id=session_id)
        return self.stub.Release(req, timeout=self.deadline_s).released


class DraftClient(_ModelServiceClient):
    stub_class = draft_pb2_grpc.DraftServiceStub

    def propose(self, sync: SyncRequest, sampling: SamplingParams, options: ProposeOptions,
                meter: WireBytes | None = None, cancel: Cancel | None = None) -> Proposal:
        """Raises grpc.RpcError, or grpc.FutureCancelledError once `cancel` was called (the
        draft then stops at its next token; its cache keeps what it had fed)."""
        req = propose_request(sync, sampling, options)

        def cancellable(req):
            if cancel.requested:
                raise grpc.FutureCancelledError()
            call = self.stub.Propose.future(req, timeout=self.deadline_s)
            cancel.attach(call)
            return call.result()

        resp = self._unary(self.stub.Propose, req, meter,
                           cancellable if cancel is not None else None)
        return Proposal(list(resp.tokens), list(resp.dists), resp.cached_len,
                        options.num_tokens, resp.step_seconds)

    def score(self, sync: SyncRequest, heads: list[Head], params: ContrastiveParams,
              meter: WireBytes | None = None,
              read_only: bool = False) -> tuple[list[torch.Tensor], int, int | None]:
        """The amateur's values on each head's ids, the draft's cached length, and (read
        only) the token it drew after the sequence, if known."""
        req = draft_pb2.ScoreRequest(
            session_id=sync.session_id, keep_len=sync.keep_len, keep_digest=sync.keep_digest,
            new_tokens=sync.new_tokens, contrastive=wire.contrastive_to_proto(params),
            heads=[common_pb2.HeadValues(token_ids=h.token_ids.tolist()) for h in heads],
            read_only=read_only)
        resp = self._unary(self.stub.Score, req, meter)
        values = [torch.tensor(list(v.values), dtype=torch.float32) for v in resp.values]
        return values, resp.cached_len, \
            resp.next_token if resp.HasField("next_token") else None

    def propose_batch(self, items: list[draft_pb2.ProposeRequest]) -> BatchCall:
        """Many sessions' Proposes in one call, started now (ProposeBatch)."""
        return self._batch(self.stub.ProposeBatch, draft_pb2.ProposeBatchRequest(items=items),
                           "result")


class TargetClient(_ModelServiceClient):
    stub_class = target_pb2_grpc.TargetServiceStub

    def verify(self, sync: SyncRequest, drafts: list[int],
               draft_dists: list[common_pb2.SparseDist], sampling: SamplingParams,
               round_seed: int, meter: WireBytes | None = None,
               contrastive: ContrastiveParams | None = None, bonus_seed: int | None = None,
               ) -> tuple[TargetRound | Heads, int]:
        """A round (p_i(x_i), recovered, bonus), or with `contrastive` V_head per position.
        `bonus_seed`: the bonus by coupled Gumbel-max (VerifyRequest.bonus_seed)."""
        req = verify_request(sync, drafts, draft_dists, sampling, round_seed, contrastive,
                             bonus_seed)
        resp = self._unary(self.stub.Verify, req, meter)
        if contrastive is not None:
            heads = [Head(torch.tensor(list(h.token_ids), dtype=torch.long),
                          torch.tensor(list(h.values), dtype=torch.float32))
                     for h in resp.heads]
            return Heads(heads, resp.pass_sessions, resp.pass_tokens,
                         resp.pass_seconds), resp.cached_len
        return target_round_of(resp), resp.cached_len

    def verify_batch(self, items: list[target_pb2.VerifyRequest]) -> BatchCall:
        """Many sessions' Verifies in one call, started now (VerifyBatch)."""
        req = target_pb2.VerifyBatchRequest(items=items)
        return self._batch(self.stub.VerifyBatch, req, "result")


def target_round_of(resp: target_pb2.VerifyResponse) -> TargetRound:
    return TargetRound(list(resp.target_probs), list(resp.recovered_tokens),
                       resp.bonus_token, resp.pass_sessions, resp.pass_tokens,
                       resp.pass_seconds,
                       [logprobs_from_proto(e) for e in resp.logprobs] or None,
                       [logprobs_from_proto(e) for e in resp.prompt_logprobs] or None)


def propose_request(sync: SyncRequest, sampling: SamplingParams,
                    options: ProposeOptions) -> draft_pb2.ProposeRequest:
    return message_from(
        draft_pb2.ProposeRequest, options, session_id=sync.session_id,
        keep_len=sync.keep_len, keep_digest=sync.keep_digest, new_tokens=sync.new_tokens,
        sampling=wire.sampling_to_proto(sampling, grammar_spec=sync.keep_len == 0))


def verify_request(sync: SyncRequest, drafts: list[int],
                   draft_dists: list[common_pb2.SparseDist], sampling: SamplingParams,
                   round_seed: int, contrastive: ContrastiveParams | None = None,
                   bonus_seed: int | None = None, logprobs: int | None = None,
                   prompt_logprobs: bool = False) -> target_pb2.VerifyRequest:
    req = target_pb2.VerifyRequest(
        session_id=sync.session_id, keep_len=sync.keep_len, keep_digest=sync.keep_digest,
        new_tokens=sync.new_tokens + drafts, num_draft=len(drafts),
        draft_dists=draft_dists,
        sampling=wire.sampling_to_proto(sampling, grammar_spec=sync.keep_len == 0),
        round_seed=round_seed, bonus_seed=bonus_seed, logprobs=logprobs,
        prompt_logprobs=prompt_logprobs,
    )
    if contrastive is not None:
        req.contrastive.CopyFrom(wire.contrastive_to_proto(contrastive))
    return req



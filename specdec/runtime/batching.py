"""The continuous scheduler of a model service: every queued step runs in the next pass.

Requests (Verify, Propose) run in their own threads; each forward pass they need is a
*step* (a session and the tokens to feed it) handed to the one scheduler thread. While a
pass runs, new steps queue. When it ends, the scheduler takes every queued step, oldest
first, up to a budget of tokens (`max_batch_tokens`; a step larger than the budget runs
alone, and CachedModel feeds it in budget-sized passes), into the next pass: continuous
batching as vLLM (Kwon et al. 2023) and TGI do it, with no fixed window. Sessions join
and leave between passes.

Keeping sessions together. A step submitted with `more=True` says the same session may
send its next step soon after this one's result: the next token of a Propose (certain),
or the next Verify of a target-only round (a speculative round's next Verify waits on
the draft, so it does not say so). The scheduler measures each session's return gap
(result to next step). Before the next pass it waits for the sessions of the last pass
whose last gap was short (at most a quarter of the last pass; unknown counts as short),
never longer than half the last pass or `max_wait_s`, and not at all once a budget's
worth of tokens is queued. Sessions that come back late are not waited for, so a
Verify never sits out a pass for a generation that is still drafting.
Without this, sessions that finish a pass together split into two half-size groups that
alternate (each returns while the other's pass runs), halving what every pass does.
A session that will not come back says so (`leave`). `linger_s` (default 0) optionally
waits for more steps before any pass.

Isolation: a step whose caller has gone (`cancelled()`) is dropped before its pass with
`Cancelled`, touching nothing. If a pass fails, each of its steps is retried alone, so
only the step that fails gets the error; backends move a session's length only after a
successful pass, so a failed pass leaves every session as it was.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from specdec.errors import Cancelled
from specdec.service_config import DEFAULT_MAX_BATCH_TOKENS

log = logging.getLogger(__name__)

# (cache, tokens to feed, how many last positions' logits to return): one backend row.
Item = tuple[Any, list[int], int]

DEFAULT_MAX_WAIT_S = 0.05
FAST_RETURN = 0.25  # a return gap up to this fraction of the last pass is waited for
MAX_TRACKED = 4096  # return gaps remembered (sessions), oldest forgotten first


def _never() -> bool:
    return False


@dataclass
class Pass:
    """What one forward pass held (for metrics and tests)."""

    sessions: int
    tokens: int
    seconds: float
    queue_wait_s: list[float]


@dataclass
class Step:
    owner: object  # the session; one step per session at a time (check-out rule)
    item: Item
    more: bool
    cancelled: Callable[[], bool]
    queued_at: float = field(default_factory=time.perf_counter)
    done: threading.Event = field(default_factory=threading.Event)
    logits: torch.Tensor | None = None
    error: BaseException | None = None
    ran_in: Pass | None = None

    def finish(self, logits: torch.Tensor | None = None, error: BaseException | None = None,
               ran_in: Pass | None = None):
        self.logits, self.error, self.ran_in = logits, error, ran_in
        self.done.set()


class Scheduler:
    def __init__(self, forward_batch: Callable[[list[Item]], list[torch.Tensor]],
                 max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS, linger_s: float = 0.0,
                 max_wait_s: float = DEFAULT_MAX_WAIT_S,
                 on_pass: Callable[[Pass], None] | None = None, name: str = "scheduler"):
        if max_batch_tokens < 1:
            raise ValueError(f"max_batch_tokens must be >= 1, got {max_batch_tokens}")
        self._forward_batch = forward_batch
        self.max_batch_tokens = max_batch_tokens
        self.linger_s, self.max_wait_s = linger_s, max_wait_s
        self.on_pass = on_pass
        self._queue: list[Step] = []
        # Sessions of the last pass waited for before the next pass; `_returning`: when
        # each session said to come back got its result (id(owner) -> time), kept until
        # it returns, to measure its gap; `_gaps`: each session's last gap.
        self._expected: set[int] = set()
        self._returning: dict[int, float] = {}
        self._gaps: dict[int, float] = {}
        self._last_pass_s = 0.0
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    # -- callers ----------------------------------------------------------------------

    def run(self, owner: object, item: Item, more: bool = False,
            cancelled: Callable[[], bool] | None = None) -> torch.Tensor:
        """Queue one step and wait for its logits (or raise its own error)."""
        return self.run_step(owner, item, more, cancelled)[0]

    def run_step(self, owner: object, item: Item, more: bool = False,
                 cancelled: Callable[[], bool] | None = None) -> tuple[torch.Tensor, Pass]:
        """`run`, also returning the pass the step ran in (cancelled None = never)."""
        step = Step(owner, item, more, cancelled or _never)
        with self._cond:
            if self._closed:
                raise RuntimeError("the scheduler is closed")
            finished = self._returning.pop(id(owner), None)
            if finished is not None:
                self._gaps.pop(id(owner), None)
                self._gaps[id(owner)] = time.perf_counter() - finished
                while len(self._gaps) > MAX_TRACKED:
                    del self._gaps[next(iter(self._gaps))]
            self._queue.append(step)
            self._cond.notify_all()
        step.done.wait()
        if step.error is not None:
            raise step.error
        return step.logits, step.ran_in

    def run_many(self, steps: list[tuple[object, Item]],
                 cancelled: Callable[[], bool] | None = None,
                 ) -> list[tuple[torch.Tensor | None, Pass | None, BaseException | None]]:
        """Queue several sessions' steps at once (a batch call's), so that they ride the
        same pass (budget permitting), and wait for all of them. Per step: (logits, the
        pass it ran in, None) or (None, None, its own error); one step's failure never
        fails another's."""
        queued = [Step(owner, item, False, cancelled or _never) for owner, item in steps]
        with self._cond:
            if self._closed:
                raise RuntimeError("the scheduler is closed")
            self._queue.extend(queued)
            self._cond.notify_all()
        for step in queued:
            step.done.wait()
        return [(s.logits, s.ran_in, s.error) for s in queued]

    def leave(self, owner: object) -> None:
        """`owner` will not submit the step it announced with more=True."""
        with self._cond:
            self._returning.pop(id(owner), None)
            self._gaps.pop(id(owner), None)
            if id(owner) in self._expected:
                self._expected.discard(id(owner))
                self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=5)

    # -- the scheduler thread -----------------------------------------------------------

    def _take(self) -> list[Step] | None:
        with self._cond:
            while not self._queue and not self._closed:
                self._cond.wait()
            if self._closed:
                for step in self._queue:
                    step.finish(error=RuntimeError("the service is shutting down"))
                return None
            deadline = time.perf_counter() + self._wait_bound()
            while self._missing() and (left := deadline - time.perf_counter()) > 0:
                self._cond.wait(left)
            if self.linger_s > 0:
                self._cond.wait(self.linger_s)
            self._expected.clear()
            batch, tokens = [], 0
            for step in list(self._queue):
                n = len(step.item[1])
                if batch and tokens + n > self.max_batch_tokens:
                    continue  # waits for the next pass; smaller later steps may still fit
                batch.append(step)
                tokens += n
            for step in batch:
                self._queue.remove(step)
            return batch

    def _wait_bound(self) -> float:
        """How long to wait for the sessions expected back (see the module's notes)."""
        return min(self.max_wait_s, 0.5 * self._last_pass_s) if self._expected else 0.0

    def _missing(self) -> bool:
        if sum(len(s.item[1]) for s in self._queue) >= self.max_batch_tokens:
            return False
        queued = {id(s.owner) for s in self._queue}
        return any(owner not in queued for owner in self._expected)

    def _serve(self) -> None:
        while (batch := self._take()) is not None:
            try:
                live = []
                for step in batch:
                    if step.cancelled():
                        step.finish(error=Cancelled("the client called this request off"))
                    else:
                        live.append(step)
                if live:
                    self._run(live)
            except Exception as exc:  # noqa: BLE001 - the thread must outlive any step
                log.exception("scheduler pass failed outside the model")
                for step in batch:
                    if not step.done.is_set():
                        step.finish(error=exc)

    def _run(self, batch: list[Step]) -> None:
        start = time.perf_counter()
        try:
            results = self._forward_batch([s.item for s in batch])
        except Exception as exc:  # noqa: BLE001 - isolate the step that fails
            if len(batch) == 1:
                batch[0].finish(error=exc)
                return
            log.warning("a batched pass of %d sessions failed (%s); running them one by one",
                        len(batch), exc)
            for step in batch:
                self._run([step])
            return
        end = time.perf_counter()
        seconds = end - start
        with self._cond:
            self._last_pass_s = seconds
            fast = FAST_RETURN * seconds
            for step in batch:
                if step.more:
                    key = id(step.owner)
                    self._returning[key] = end
                    if self._gaps.get(key, 0.0) <= fast:
                        self._expected.add(key)
            while len(self._returning) > MAX_TRACKED:
                del self._returning[next(iter(self._returning))]
        done = Pass(len(batch), sum(len(s.item[1]) for s in batch), seconds,
                    [start - s.queued_at for s in batch])
        for step, logits in zip(batch, results, strict=True):
            step.finish(logits, ran_in=done)
        if self.on_pass is not None:
            try:
                self.on_pass(done)
            except Exception:  # noqa: BLE001 - metrics must never stop the model
                log.exception("on_pass callback failed")

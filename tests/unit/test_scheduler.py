"""The continuous scheduler's rules, with a fake forward pass that records what it was fed.

The first pass is held on an event so that the steps submitted meanwhile are certainly
queued when it ends (the same trick as tests/service/test_metrics_target.py); every
test then asserts exactly which passes ran with which steps.
"""

from __future__ import annotations

import threading
import time

import pytest
import torch

from specdec.errors import Cancelled
from specdec.runtime.batching import Pass, Scheduler

VOCAB = 4


class Owner:
    """A session as the scheduler sees it: any object, told apart by identity."""

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return self.name


def logits_for(label: str, keep_last: int) -> torch.Tensor:
    """What the fake returns for a row: distinct per label, so misrouting shows."""
    return torch.full((keep_last, VOCAB), float(sum(map(ord, label))))


class FakeModel:
    """forward_batch that records each pass (labels, in order) and when it ran.

    `hold_first`: the first pass waits for `release` (so others queue meanwhile);
    `min_first_s`: and lasts at least that long (the scheduler's waits scale with it);
    `bad`: a pass holding this label raises."""

    def __init__(self, hold_first: bool = True, min_first_s: float = 0.0,
                 bad: str | None = None):
        self.hold_first, self.min_first_s, self.bad = hold_first, min_first_s, bad
        self.started, self.release = threading.Event(), threading.Event()
        self.passes: list[list[str]] = []
        self.times: list[tuple[float, float]] = []  # (start, end) per pass
        self.lock = threading.Lock()

    def __call__(self, items):
        start = time.perf_counter()
        labels = [label for label, _, _ in items]
        with self.lock:
            first = not self.passes
            self.passes.append(labels)
        if first and self.hold_first:
            self.started.set()
            assert self.release.wait(10), "the test never released the first pass"
            time.sleep(max(0.0, self.min_first_s - (time.perf_counter() - start)))
        try:
            if self.bad is not None and self.bad in labels:
                raise ValueError(f"the model cannot take {self.bad}")
            return [logits_for(label, keep) for label, _, keep in items]
        finally:
            with self.lock:
                self.times.append((start, time.perf_counter()))


class Caller:
    """A thread submitting one step; keeps its logits or its error."""

    def __init__(self, sched: Scheduler, owner: Owner, label: str, tokens: int = 1,
                 keep_last: int = 1, more: bool = False, cancelled=None):
        self.label, self.keep_last = label, keep_last
        self.logits: torch.Tensor | None = None
        self.error: BaseException | None = None
        kwargs = {} if cancelled is None else {"cancelled": cancelled}

        def run():
            try:
                self.logits = sched.run(owner, (label, [1] * tokens, keep_last), more,
                                        **kwargs)
            except BaseException as exc:  # noqa: BLE001 - kept for the test to inspect
                self.error = exc

        self.thread = threading.Thread(target=run, daemon=True)

    def start(self, sched: Scheduler | None = None, queued: int | None = None) -> Caller:
        self.thread.start()
        if sched is not None:  # wait until the step is queued: submission order is fixed
            wait_until(lambda: len(sched._queue) >= queued)
        return self

    def result(self) -> torch.Tensor:
        self.thread.join(10)
        assert not self.thread.is_alive(), f"{self.label} never returned"
        assert self.error is None, self.error
        return self.logits

    def failure(self) -> BaseException:
        self.thread.join(10)
        assert not self.thread.is_alive(), f"{self.label} never returned"
        assert self.error is not None, f"{self.label} got logits, not an error"
        return self.error

    def assert_own_logits(self) -> None:
        torch.testing.assert_close(self.result(), logits_for(self.label, self.keep_last))


def wait_until(condition, timeout: float = 10.0) -> None:
    deadline = time.perf_counter() + timeout
    while not condition():
        assert time.perf_counter() < deadline, "timed out waiting"
        time.sleep(0.001)


@pytest.fixture()
def make():
    """Scheduler(fake, **kwargs), closed after the test."""
    made: list[Scheduler] = []

    def build(fake: FakeModel, **kwargs) -> Scheduler:
        made.append(Scheduler(fake, **kwargs))
        return made[-1]

    yield build
    for sched in made:
        sched.close()


def start_held(sched: Scheduler, fake: FakeModel, label: str = "first", **kwargs) -> Caller:
    """Submit a step and wait until its pass is running (and held)."""
    caller = Caller(sched, Owner(label), label, **kwargs).start()
    assert fake.started.wait(10)
    return caller


def queue(sched: Scheduler, specs: list[tuple]) -> list[Caller]:
    """Submit (label, kwargs) steps one after another, each certainly queued before the
    next, so their queue order is the list's."""
    callers = []
    for i, (label, kwargs) in enumerate(specs):
        callers.append(Caller(sched, Owner(label), label, **kwargs).start(sched, i + 1))
    return callers


# -- which steps share a pass ---------------------------------------------------------------


def test_steps_queued_during_a_pass_all_run_in_the_next_one_oldest_first(make):
    fake = FakeModel()
    passes: list[Pass] = []
    sched = make(fake, on_pass=passes.append)
    first = start_held(sched, fake)
    labels = [f"s{i}" for i in range(5)]
    callers = queue(sched, [(label, {"tokens": i + 1, "keep_last": 1 + i % 2})
                            for i, label in enumerate(labels)])
    fake.release.set()
    first.assert_own_logits()
    for c in callers:
        c.assert_own_logits()  # each caller gets its own row's logits, in its shape
    assert fake.passes == [["first"], labels]  # one pass for all five, in queue order
    wait_until(lambda: len(passes) == 2)  # on_pass runs after the callers are woken
    assert [(p.sessions, p.tokens) for p in passes] == [(1, 1), (5, 1 + 2 + 3 + 4 + 5)]


def test_steps_past_the_token_budget_wait_for_the_next_pass(make):
    fake = FakeModel()
    sched = make(fake, max_batch_tokens=10)
    first = start_held(sched, fake)
    # 4 + 5 fit; 3 more would make 12; the 1-token step still fits behind it (10).
    callers = queue(sched, [("a4", {"tokens": 4}), ("b5", {"tokens": 5}),
                            ("c3", {"tokens": 3}), ("d1", {"tokens": 1})])
    fake.release.set()
    for c in [first, *callers]:
        c.assert_own_logits()
    assert fake.passes == [["first"], ["a4", "b5", "d1"], ["c3"]]


def test_a_step_larger_than_the_budget_runs_alone(make):
    fake = FakeModel()
    sched = make(fake, max_batch_tokens=8)
    first = start_held(sched, fake)
    callers = queue(sched, [("big", {"tokens": 20}), ("small", {"tokens": 1}),
                            ("small2", {"tokens": 2})])
    fake.release.set()
    for c in [first, *callers]:
        c.assert_own_logits()
    assert fake.passes == [["first"], ["big"], ["small", "small2"]]


def test_a_budget_of_zero_is_refused():
    with pytest.raises(ValueError, match="max_batch_tokens"):
        Scheduler(FakeModel(), max_batch_tokens=0)


# -- isolation ---------------------------------------------------------------------------------


def test_a_step_cancelled_before_its_pass_is_dropped_and_the_others_run(make):
    fake = FakeModel()
    passes: list[Pass] = []
    sched = make(fake, on_pass=passes.append)
    first = start_held(sched, fake)
    gone = threading.Event()
    callers = queue(sched, [("keep1", {"tokens": 2}), ("gone", {"cancelled": gone.is_set}),
                            ("keep2", {"tokens": 3})])
    gone.set()  # the client hangs up while its step waits
    fake.release.set()
    first.assert_own_logits()
    keep1, dropped, keep2 = callers
    assert isinstance(dropped.failure(), Cancelled)
    keep1.assert_own_logits()
    keep2.assert_own_logits()
    assert fake.passes == [["first"], ["keep1", "keep2"]]  # "gone" was never fed
    wait_until(lambda: len(passes) == 2)
    assert [(p.sessions, p.tokens) for p in passes] == [(1, 1), (2, 5)]


def test_a_pass_of_only_cancelled_steps_runs_nothing(make):
    fake = FakeModel()
    sched = make(fake)
    first = start_held(sched, fake)
    (dropped,) = queue(sched, [("gone", {"cancelled": lambda: True})])
    fake.release.set()
    first.assert_own_logits()
    assert isinstance(dropped.failure(), Cancelled)
    after = Caller(sched, Owner("after"), "after").start()
    after.assert_own_logits()  # the scheduler carries on
    assert fake.passes == [["first"], ["after"]]


def test_a_bad_step_in_a_batch_fails_alone(make):
    fake = FakeModel(bad="bad")
    passes: list[Pass] = []
    sched = make(fake, on_pass=passes.append)
    first = start_held(sched, fake)
    good1, bad, good2 = queue(sched, [("good1", {}), ("bad", {"tokens": 2}),
                                      ("good2", {"keep_last": 2})])
    fake.release.set()
    first.assert_own_logits()
    good1.assert_own_logits()
    good2.assert_own_logits()
    error = bad.failure()
    assert isinstance(error, ValueError) and "cannot take bad" in str(error)
    # The batch failed, then each step ran alone: only "bad" failed again.
    assert fake.passes == [["first"], ["good1", "bad", "good2"], ["good1"], ["bad"],
                           ["good2"]]
    # Metrics count the passes that ran: the two good retries, not the failed ones.
    wait_until(lambda: len(passes) == 3)
    assert [(p.sessions, p.tokens) for p in passes] == [(1, 1), (1, 1), (1, 1)]
    later = Caller(sched, Owner("later"), "later").start()
    later.assert_own_logits()


def test_after_a_retried_batch_every_returning_session_is_waited_for(make):
    """Each retry runs one step; the sessions that said more=True in all of them (not only
    the last retried) are the ones the next pass waits for."""
    fake = FakeModel(bad="bad")
    sched = make(fake)
    first = start_held(sched, fake)
    owners = {label: Owner(label) for label in ("good1", "bad", "good2")}
    callers = [Caller(sched, owners[label], label, more=label != "bad").start(sched, i + 1)
               for i, label in enumerate(owners)]
    fake.release.set()
    first.assert_own_logits()
    callers[0].assert_own_logits()
    callers[2].assert_own_logits()
    assert isinstance(callers[1].failure(), ValueError)
    wait_until(lambda: len(fake.passes) == 5)
    with sched._cond:
        assert sched._expected == {id(owners["good1"]), id(owners["good2"])}


# -- keeping returning sessions together ---------------------------------------------------------


def _return_after_first_pass(sched, fake, more: bool, come_back: bool | None,
                             return_delay_s: float = 0.1):
    """Session A's step runs (held) with `more`; B queues meanwhile. After its pass, A
    comes back after `return_delay_s` (or leaves at once, or never comes back)."""
    a = Owner("A")
    done = threading.Event()
    out: dict[str, float] = {}

    def session_a():
        sched.run(a, ("A1", [1], 1), more)
        out["returned"] = time.perf_counter()
        if come_back:
            time.sleep(return_delay_s)
            sched.run(a, ("A2", [1], 1))
        elif come_back is False and more:
            sched.leave(a)
        done.set()

    threading.Thread(target=session_a, daemon=True).start()
    assert fake.started.wait(10)
    (b,) = queue(sched, [("B", {})])
    fake.release.set()
    b.assert_own_logits()
    assert done.wait(10)
    return out


def test_a_session_that_said_more_is_waited_for(make):
    """A (more=True) comes back 0.1 s after its pass; B, queued long before, waits for it
    and both run in one pass. Without more=True they run in two passes (the control)."""
    for more, expected in ((True, [["A1"], ["B", "A2"]]),
                           (False, [["A1"], ["B"], ["A2"]])):
        fake = FakeModel(min_first_s=0.6)  # the wait is bounded by half the last pass
        sched = make(fake, max_wait_s=1.0)
        _return_after_first_pass(sched, fake, more=more, come_back=True)
        passes = len(expected)
        wait_until(lambda f=fake, n=passes: len(f.times) == n)
        assert fake.passes == expected, f"more={more}"


def test_leave_ends_the_wait_at_once(make):
    fake = FakeModel(min_first_s=1.2)  # waits of up to min(2.0, 0.6) s for A
    sched = make(fake, max_wait_s=2.0)
    _return_after_first_pass(sched, fake, more=True, come_back=False)
    assert fake.passes == [["A1"], ["B"]]
    gap = fake.times[1][0] - fake.times[0][1]
    assert gap < 0.3, f"B waited {gap:.3f} s after A left"


def test_a_session_that_never_comes_back_delays_the_next_pass_by_max_wait_at_most(make):
    fake = FakeModel(min_first_s=0.8)  # half the pass (0.4 s) is above max_wait_s
    sched = make(fake, max_wait_s=0.15)
    _return_after_first_pass(sched, fake, more=True, come_back=None)
    assert fake.passes == [["A1"], ["B"]]
    gap = fake.times[1][0] - fake.times[0][1]
    assert 0.12 <= gap < 0.15 + 0.5, f"B waited {gap:.3f} s for a session that never came"


def test_no_wait_for_returning_sessions_once_a_budget_of_tokens_is_queued(make):
    fake = FakeModel(min_first_s=1.0)
    sched = make(fake, max_wait_s=2.0, max_batch_tokens=4)
    a = Owner("A")
    threading.Thread(target=lambda: sched.run(a, ("A1", [1], 1), True), daemon=True).start()
    assert fake.started.wait(10)
    (b,) = queue(sched, [("B", {"tokens": 4})])  # a whole budget
    fake.release.set()
    b.assert_own_logits()
    gap = fake.times[1][0] - fake.times[0][1]
    assert gap < 0.3, f"B waited {gap:.3f} s with a full budget queued"
    sched.leave(a)


# -- metrics and shutdown -------------------------------------------------------------------


def test_on_pass_reports_what_ran_and_how_long_each_step_queued(make):
    fake = FakeModel(min_first_s=0.2)
    passes: list[Pass] = []
    sched = make(fake, on_pass=passes.append)
    first = start_held(sched, fake, tokens=3)
    callers = queue(sched, [("x", {"tokens": 2}), ("y", {"tokens": 1})])
    fake.release.set()
    for c in [first, *callers]:
        c.assert_own_logits()
    wait_until(lambda: len(passes) == 2)
    held, second = passes
    assert (held.sessions, held.tokens) == (1, 3)
    assert (second.sessions, second.tokens) == (2, 3)
    assert len(held.queue_wait_s) == 1 and 0 <= held.queue_wait_s[0] < 0.1
    # x and y queued while the held pass ran (at least 0.2 s), x before y
    assert len(second.queue_wait_s) == 2
    assert second.queue_wait_s[0] >= second.queue_wait_s[1] > 0.0
    assert second.queue_wait_s[0] < 0.2 + 5.0
    assert held.seconds >= 0.2 - 0.01
    assert 0 <= second.seconds < held.seconds
    for p, (start, end) in zip(passes, fake.times, strict=True):
        assert p.seconds <= end - start + 0.05


def test_close_fails_queued_steps_instead_of_hanging(make):
    fake = FakeModel()
    sched = make(fake)
    first = start_held(sched, fake)
    callers = queue(sched, [("q1", {}), ("q2", {})])
    closer = threading.Thread(target=sched.close, daemon=True)
    closer.start()
    wait_until(lambda: sched._closed)
    with pytest.raises(RuntimeError, match="closed"):
        sched.run(Owner("late"), ("late", [1], 1))
    fake.release.set()
    first.assert_own_logits()  # the pass already running completes
    for c in callers:
        error = c.failure()
        assert isinstance(error, RuntimeError) and "shutting down" in str(error)
    closer.join(10)
    assert not closer.is_alive()
    assert fake.passes == [["first"]]


def test_close_of_an_idle_scheduler_returns_at_once():
    sched = Scheduler(FakeModel(hold_first=False))
    t0 = time.perf_counter()
    sched.close()
    assert time.perf_counter() - t0 < 1.0
    assert not sched._thread.is_alive()

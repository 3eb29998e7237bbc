"""coordinator.api.bridge: a generation is closed after the step in flight, even when the task
closing it is cancelled again while it waits (as Ray Serve does)."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from coordinator.api.bridge import close_after, next_in_thread


def _slow_generation(started: threading.Event, closed: list, step_s: float = 0.3):
    try:
        for i in range(100):
            started.set()
            time.sleep(step_s)
            yield i
    finally:
        closed.append(True)


def test_cancelled_twice_while_waiting_still_closes_after_the_step():
    started, closed = threading.Event(), []
    gen = _slow_generation(started, closed)
    errors: list = []

    async def consume(executor):
        pending: list = []
        try:
            while True:
                await next_in_thread(gen, pending, executor)
        finally:
            await close_after(gen, pending, executor)

    async def main():
        with ThreadPoolExecutor(4) as executor:
            task = asyncio.get_running_loop().create_task(consume(executor))
            await asyncio.sleep(0.45)  # mid-way through the second step
            task.cancel()
            await asyncio.sleep(0.05)  # now waiting for the step in close_after
            task.cancel()  # cancelled again, as Serve does
            try:
                await task
            except asyncio.CancelledError:
                pass
            except Exception as exc:  # noqa: BLE001 - what the old code raised
                errors.append(exc)
            # The close goes on in its thread after the step; nothing raised.
            deadline = time.monotonic() + 2
            while not closed and time.monotonic() < deadline:
                await asyncio.sleep(0.02)

    asyncio.run(main())
    assert errors == [] and closed == [True]


def test_a_step_not_started_is_never_run():
    started, closed = threading.Event(), []
    gen = _slow_generation(started, closed)

    async def main():
        with ThreadPoolExecutor(1) as executor:
            blocker = executor.submit(time.sleep, 0.3)  # the only thread is busy
            pending: list = []
            step = asyncio.ensure_future(next_in_thread(gen, pending, executor))
            await asyncio.sleep(0.05)
            step.cancel()
            await close_after(gen, pending, executor)
            blocker.result()

    asyncio.run(main())
    assert not started.is_set()  # the cancelled step never ran
    assert next(gen, "closed") == "closed"  # and the generation is closed


def _generation_whose_close_fails():
    try:
        while True:
            yield 0
    finally:
        raise RuntimeError("release failed: the target is gone")


def test_a_failing_close_is_logged_not_left_on_a_future(caplog):
    """The soak's "Future exception was never retrieved": a close that raised, behind a
    shield whose task had been cancelled, left its exception on a future nobody read."""
    gen = _generation_whose_close_fails()
    next(gen)
    unhandled: list = []

    async def main():
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _loop, ctx: unhandled.append(ctx))
        with ThreadPoolExecutor(2) as executor:
            blocker = executor.submit(time.sleep, 0.2)  # the step still in flight
            task = loop.create_task(close_after(gen, [blocker], executor))
            await asyncio.sleep(0.05)
            task.cancel()  # Serve cancels the handler while the close waits
            try:
                await task
            except asyncio.CancelledError:
                pass
            await asyncio.sleep(0.4)  # the close has run in its thread by now
        gc.collect()  # an unretrieved exception is reported when its future is collected
        await asyncio.sleep(0)

    with caplog.at_level("WARNING", logger="coordinator.api.bridge"):
        asyncio.run(main())
    assert unhandled == []
    assert any("release failed" in r.getMessage() for r in caplog.records)

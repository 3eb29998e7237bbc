"""coordinator.api.bridge: a generation is closed after the step in flight, even when the task
closing it is cancelled again while it waits (as Ray Serve does)."""

from __future__ import annotations

import asyncio
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

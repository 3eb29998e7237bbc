"""Blocking generation, asyncio servers: run one round at a time in a worker thread.

A round blocks its thread for a whole Propose + Verify, so the Serve deployment's gRPC
methods and its HTTP routes both step `GenerationService.stream` here, in the
deployment's own pool, and close it (which releases the draft and target sessions)
once a round still running has finished.

Closing must survive cancellation. Ray Serve may cancel the task again while it waits
for the round in flight; a close that stopped waiting then would call `close()` on a
generator that is still executing (ValueError), and the generation would keep its slot
and sessions until garbage collection. So the wait and the close both happen in a pool
thread (`_close_when_done`), started before the first await: once started, they finish
whatever happens to the task that asked for them.
"""

from __future__ import annotations

import asyncio
from concurrent import futures


async def next_in_thread(iterator, pending: list, executor):
    """next(iterator) in a thread; the step's future is kept for close_after."""
    step = executor.submit(next, iterator, None)
    pending[:] = [step]
    return await asyncio.wrap_future(step)


def _close_when_done(iterator, step: futures.Future | None) -> None:
    if step is not None:
        futures.wait([step])  # a step cancelled before it started is done at once
    iterator.close()


async def close_after(iterator, pending: list, executor) -> None:
    """Close a generator once a step still running in a thread has finished. The close
    runs to the end even if this coroutine is cancelled meanwhile (it then re-raises)."""
    closing = executor.submit(_close_when_done, iterator, pending[0] if pending else None)
    await asyncio.shield(asyncio.wrap_future(closing))

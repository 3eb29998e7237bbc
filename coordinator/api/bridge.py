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

A close can fail: releasing sessions on a service that has just died raises. Nobody may
be waiting for it then (the task was cancelled, and `asyncio.shield` keeps the inner
future alone), and an exception left on that future is logged by asyncio as "Future
exception was never retrieved" when it is collected. So the close logs its own failure
as a warning and returns: the generation is over either way, and the service's session
expiry frees what the release could not.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent import futures

log = logging.getLogger(__name__)


async def next_in_thread(iterator, pending: list, executor):
    """next(iterator) in a thread; the step's future is kept for close_after."""
    step = executor.submit(next, iterator, None)
    pending[:] = [step]
    return await asyncio.wrap_future(step)


def _close_when_done(iterator, step: futures.Future | None) -> None:
    if step is not None:
        futures.wait([step])  # a step cancelled before it started is done at once
    try:
        iterator.close()
    except Exception as exc:  # noqa: BLE001 - see the module's docstring
        log.warning("closing a generation failed (%s: %s); its sessions expire on the "
                    "services instead", type(exc).__name__, exc)


async def close_after(iterator, pending: list, executor) -> None:
    """Close a generator once a step still running in a thread has finished. The close
    runs to the end even if this coroutine is cancelled meanwhile (it then re-raises)."""
    closing = executor.submit(_close_when_done, iterator, pending[0] if pending else None)
    await asyncio.shield(asyncio.wrap_future(closing))

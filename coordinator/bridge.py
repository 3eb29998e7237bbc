"""Blocking generation, asyncio servers: run one round at a time in a worker thread.

A round blocks its thread for a whole Propose + Verify, so the Serve deployment's gRPC
methods and its HTTP routes both step `GenerationService.stream` here, in the
deployment's own pool, and close it (which releases the draft and target sessions)
once a round still running has finished.
"""

from __future__ import annotations

import asyncio


async def next_in_thread(iterator, pending: list, executor):
    """next(iterator) in a thread; the future is kept so a cancel can wait for it."""
    future = asyncio.get_running_loop().run_in_executor(executor, next, iterator, None)
    pending[:] = [future]
    return await future


async def close_after(iterator, pending: list, executor) -> None:
    """Close a generator, first letting a step still running in a thread finish."""
    if pending:
        try:
            await asyncio.shield(pending[0])
        except BaseException:  # noqa: BLE001 - the step's own failure is reported elsewhere
            pass
    await asyncio.get_running_loop().run_in_executor(executor, iterator.close)

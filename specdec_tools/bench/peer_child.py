"""The child-process side of specdec_tools.bench.peers. Only the standard library is imported
at module level: the process is pinned before any runtime (torch included) starts a
thread, so every thread it ever has inherits the affinity."""

from __future__ import annotations

import os


def threads_confined_to(cpus: set[int]) -> bool:
    return all(os.sched_getaffinity(int(tid)) <= cpus
               for tid in os.listdir("/proc/self/task"))


def serve(fd: int) -> None:
    """`python -c '...serve(FD)'`: the first message on the connection at FD is (cpus,
    kind, options); then (message, max_new_tokens, sampling) jobs until None."""
    from multiprocessing.connection import Connection

    conn = Connection(fd)
    cpus, kind, options = conn.recv()
    main(conn, cpus, kind, options)


def main(conn, cpus, kind: str, options: dict) -> None:
    if cpus is not None:
        os.sched_setaffinity(0, cpus)  # before any runtime starts a thread
    try:
        from specdec_tools.bench import load_peers, scenarios

        # the peers of `specdec load` run windows of concurrent requests (load_peers)
        build = load_peers.build if kind in load_peers.KINDS else scenarios.build
        peer = build(kind, **options)
        if cpus is not None and not threads_confined_to(set(cpus)):
            raise RuntimeError(f"a thread of the peer escaped CPUs {sorted(cpus)}: "
                               + ", ".join(f"{t} {sorted(os.sched_getaffinity(int(t)))}"
                                           for t in os.listdir("/proc/self/task")))
        conn.send(("ready", peer.name))
    except Exception as exc:  # noqa: BLE001 - sent to the parent
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    while True:
        job = conn.recv()
        if job is None:
            return
        try:
            conn.send(("ok", peer.run(*job)))
        except Exception as exc:  # noqa: BLE001 - sent to the parent
            conn.send(("error", f"{type(exc).__name__}: {exc}"))

"""Regression (found by the soak): one outage seen by many generations at once must back a
replica off once, not once per generation.

Before the fix, each of N generations pinned to a crashed replica called
Router.mark_failed, doubling its back-off N times: 12 streams took it straight to the
60 s cap, so a target (or draft) restarted within seconds stayed unused for a minute and,
with no other target left, every request got UNAVAILABLE long after it was back.
"""

from __future__ import annotations

import signal
import threading
import time

import pytest

from coordinator.deploy.config import CoordinatorConfig
from coordinator.deploy.setup import build_service
from coordinator.remote.routing import Router
from specdec import launcher
from specdec.errors import Unavailable
from specdec.pair import TINY_PAIR
from specdec.v1 import generate_pb2


class Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


def test_failures_of_one_outage_count_once():
    clock = Clock()
    router = Router.from_clients({"a:1": object()})
    router.clock = clock
    (a,) = router.replicas()
    for _ in range(12):  # twelve generations pinned to it see the same crash
        router.mark_failed(a, once_per_outage=True)
    assert (a.failures, a.down_until) == (1, 102.0)
    clock.now = 102.0  # back-off over: the next failure is a new one and doubles
    router.mark_failed(a, once_per_outage=True)
    router.mark_failed(a, once_per_outage=True)
    assert (a.failures, a.down_until) == (2, 106.0)
    router.mark_ok(a)
    assert (a.failures, a.down_until) == (0, 0.0)


def _request(n: int) -> generate_pb2.GenerateRequest:
    return generate_pb2.GenerateRequest(prompt_token_ids=[5, 6, 7], max_new_tokens=n,
                                        num_draft_tokens=0)


@pytest.mark.slow
def test_target_restarted_after_a_crash_serves_again_within_seconds():
    """Real processes: 8 generations on the only target, which is killed -9 and restarted
    on its port; a new generation succeeds within 10 s of it being back (the 60 s cap
    before the fix: 8 concurrent failures are 2 s * 2^7)."""
    spec = TINY_PAIR.target
    target = launcher.start(spec.module, spec.args(0), timeout=60)
    port = int(target.address.rsplit(":", 1)[1])
    restarted = []
    try:
        service = build_service(CoordinatorConfig(target=target.address, rpc_deadline=5,
                                                  max_concurrency=16))
        errors: list[BaseException] = []
        started = threading.Barrier(9)

        def generation():
            chunks = service.stream(_request(2000))
            try:
                next(chunks)
                started.wait(30)
                for _ in chunks:
                    pass
            except Exception as exc:  # noqa: BLE001 - collected below
                errors.append(exc)

        threads = [threading.Thread(target=generation) for _ in range(8)]
        for t in threads:
            t.start()
        started.wait(30)
        target.stop(signal.SIGKILL)
        for t in threads:
            t.join(60)
        assert len(errors) == 8 and all(isinstance(e, Unavailable) for e in errors), errors
        (replica,) = service.loop.target.replicas()
        assert replica.failures == 1, "one outage, counted once"
        restarted.append(launcher.start(spec.module, spec.args(port), timeout=60))
        back = time.monotonic()
        while True:
            try:
                done = service.generate(_request(4))
                break
            except Unavailable:
                assert time.monotonic() - back < 10, "the restarted target stayed unused"
                time.sleep(0.2)
        assert len(done.token_ids) == 4
    finally:
        for proc in [target, *restarted]:
            proc.stop()

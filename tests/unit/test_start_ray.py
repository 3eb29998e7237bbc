"""coordinator.__main__.start_ray: a local node's start that timed out in Ray's own fixed
times (the raylet registering with its GCS, the GCS writing its port file) is retried,
within --startup-timeout, and only those failures are."""

from __future__ import annotations

import dataclasses

import pytest
import ray

import coordinator.__main__ as main
from coordinator.deploy.config import CoordinatorConfig

_TIMED_OUT = Exception("The current node timed out during startup. This could happen "
                       "because the raylet failed to start")


def _starts(monkeypatch, failures: list):
    calls, stopped = [], []

    def init(**kwargs):
        calls.append(kwargs)
        if failures:
            raise failures.pop(0)

    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(main, "_stop_children", lambda: stopped.append(True))
    return calls, stopped


# ray.init's message when the GCS did not write its port file in time (make test, two
# coordinators starting at once on 2 cores)
_NO_GCS_PORT = RuntimeError("Timed out waiting for file /tmp/specdec-ray-0/session_x/"
                            "gcs_server_port_172ac8cc")


def test_a_node_that_timed_out_is_stopped_and_started_again(monkeypatch):
    calls, stopped = _starts(monkeypatch, [_TIMED_OUT, _NO_GCS_PORT])
    main.start_ray(CoordinatorConfig(startup_timeout=60))
    assert len(calls) == 3 and len(stopped) == 2


def test_other_failures_and_a_spent_startup_timeout_raise(monkeypatch):
    _starts(monkeypatch, [RuntimeError("no such address")])
    with pytest.raises(RuntimeError, match="no such address"):
        main.start_ray(CoordinatorConfig())
    calls, _ = _starts(monkeypatch, [_TIMED_OUT, _TIMED_OUT])
    with pytest.raises(Exception, match="timed out during startup"):
        main.start_ray(dataclasses.replace(CoordinatorConfig(), startup_timeout=-1))
    assert len(calls) == 1

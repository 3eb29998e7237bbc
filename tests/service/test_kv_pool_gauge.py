"""specdec_<kind>_kv_pool_bytes: a paged OpenVINO service reports its KV block pool (what
the soak's RSS check subtracts), a torch service 0."""

from __future__ import annotations

import urllib.request

import pytest

from tests.procs import start_service
from tests.service._metrics_helpers import free_port

pytestmark = pytest.mark.slow



def _gauge(port: int, name: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
    for line in text.decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise KeyError(name)


@pytest.mark.parametrize("backend, positive", [("openvino", True), ("torch", False)])
def test_kv_pool_bytes(backend, positive):
    port = free_port()
    proc = start_service("target_service", "--model", "tiny-random", "--backend", backend,
                         "--metrics-port", str(port), timeout=120)
    try:
        value = _gauge(port, "specdec_target_kv_pool_bytes")
        assert (value > 0) == positive, value
    finally:
        assert proc.stop() == 0

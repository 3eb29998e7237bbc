"""Start specdec services as real processes in tests (see specdec.launcher)."""

from __future__ import annotations

from specdec.launcher import ROOT, ServiceProcess, start

__all__ = ["ROOT", "ServiceProcess", "start_service"]


def start_service(module: str, *args: str, timeout: float = 60.0) -> ServiceProcess:
    """`python -m <module> --port 0 <args>`, ready to use."""
    return start(module, ["--port", "0", *args], timeout=timeout)

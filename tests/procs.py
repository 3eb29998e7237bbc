"""Start specdec services as real processes, the way a user does, and stop them."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
READY = re.compile(r"service ready: .* address=(\S+):(\d+)")


@dataclass
class ServiceProcess:
    proc: subprocess.Popen
    address: str
    log: list[str] = field(default_factory=list)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    @property
    def output(self) -> str:
        return "".join(self.log)


def start_service(module: str, *args: str, timeout: float = 60.0) -> ServiceProcess:
    """`python -m <module> <args>` with --port 0; waits for its 'ready' log line."""
    proc = subprocess.Popen(
        [sys.executable, "-m", module, "--port", "0", *args],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    log: list[str] = []
    found: list[str] = []
    ready = threading.Event()

    def pump():
        for line in proc.stdout:
            log.append(line)
            m = READY.search(line)
            if m and not found:
                found.append(f"{m.group(1)}:{m.group(2)}")
                ready.set()
        ready.set()

    threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + timeout
    while not ready.wait(0.1):
        if time.monotonic() > deadline:
            proc.kill()
            raise TimeoutError(f"{module} not ready after {timeout} s:\n{''.join(log)}")
    if not found:
        raise RuntimeError(f"{module} exited before it was ready:\n{''.join(log)}")
    return ServiceProcess(proc, found[0], log)

"""Start specdec services as child processes and wait until each says it is ready.

Used by `specdec up`, `specdec demo`, and the tests that need real processes. Each
service logs one "... service ready: ... address=HOST:PORT" line when it serves.
`prefix` runs the command under another one, e.g. `ip netns exec NS` (specdec_tools.netns.network):
the prefix must exec the command (as `ip netns exec` does), so that the process signalled
and waited for is the service itself.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
READY = re.compile(r"service ready.*address=(\S+):(\d+)")


@dataclass
class ServiceProcess:
    name: str
    proc: subprocess.Popen
    address: str
    log: list[str] = field(default_factory=list)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
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


def start(module: str, args: Sequence[str], timeout: float = 120.0, echo: bool = False,
          env: dict | None = None, name: str | None = None,
          prefix: Sequence[str] = ()) -> ServiceProcess:
    """`[prefix...] python -m <module> <args>`; returns once its ready line appears."""
    proc = subprocess.Popen(
        [*prefix, sys.executable, "-m", module, *args], cwd=ROOT, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
    )
    log: list[str] = []
    found: list[str] = []
    ready = threading.Event()

    def pump():
        for line in proc.stdout:
            log.append(line)
            if echo:
                sys.stderr.write(f"[{name or module}] {line}")
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
            proc.wait(10)
            raise TimeoutError(f"{module} not ready after {timeout:.0f} s:\n{''.join(log)}")
    if not found:
        proc.wait(10)
        raise RuntimeError(f"{module} exited before it was ready:\n{''.join(log)}")
    return ServiceProcess(name or module, proc, found[0], log)

"""In-process peers in two stated set-ups, each peer in its own child process.

* **same target device** (`target-device`): the peer confined to the target service's
  core (specdec.pair.placement()) with one thread, as an in-process engine must run; it
  is compared with specdec, whose draft runs on the other core.
* **same machine** (`machine`): the peer with its default threading on all the cores
  this process may use (no INFERENCE_NUM_THREADS, torch's default threads); compared
  with specdec as deployed.

A child process (specdec_tools.bench.peer_child) is pinned with os.sched_setaffinity before
Python starts in it, so every thread the peer's runtime creates inherits the affinity (a
Python-level affinity change in this process would leave threads created earlier on
their old CPUs); the child checks every one of its threads before it says it is ready.
A peer that crashes is a finding: the harness records it and skips it (`may_fail`).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import subprocess
import sys
from dataclasses import dataclass

from specdec import launcher
from specdec.sampling import SamplingParams
from specdec_tools.bench import scenarios
from specdec_tools.bench.harness import Sample


@dataclass(frozen=True)
class Setup:
    key: str  # the --peer-setups name
    label: str  # in every scenario name
    one_core: bool  # confined to the target's core with one thread


SETUPS = {
    "target-device": Setup("target-device", "same target device: 1 core, 1 thread", True),
    "machine": Setup("machine", "same machine: all cores, default threads", False),
}


class PeerProcess:
    """A harness scenario: one peer in a child process, placed by `setup`."""

    may_fail = True

    def __init__(self, kind: str, setup: Setup, target_cpu: int | None, options: dict,
                 timeout: float = 600.0):
        self.kind, self.setup, self.timeout = kind, setup, timeout
        self.sampled = kind in scenarios.SAMPLED
        cpus = {target_cpu} if setup.one_core and target_cpu is not None else None
        options = {**options, "threads": 1 if setup.one_core else 0}
        parent, child = mp.Pipe()
        code = ("import sys; from specdec_tools.bench.peer_child import serve; "
                "serve(int(sys.argv[1]))")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", code, str(child.fileno())], cwd=launcher.ROOT,
            pass_fds=(child.fileno(),),
            stdout=sys.stderr, preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)
        child.close()
        self.conn = parent
        self.conn.send((cpus, kind, options))
        status, value = self._recv()
        if status != "ready":
            self.close()
            raise RuntimeError(f"{kind} ({setup.label}) did not start: {value}")
        self.name = f"{value} [{setup.label}]"

    def _recv(self):
        if not self.conn.poll(self.timeout):
            raise TimeoutError(f"{self.kind} did not answer within {self.timeout:.0f} s")
        try:
            return self.conn.recv()
        except EOFError:
            raise RuntimeError(f"{self.kind}'s process died (exit code "
                               f"{self.proc.wait(10)})") from None

    def run(self, message: str, max_new_tokens: int, sampling: SamplingParams) -> Sample:
        if self.proc.poll() is not None:
            raise RuntimeError(f"{self.kind}'s process is gone (exit {self.proc.returncode})")
        self.conn.send((message, max_new_tokens, sampling))
        status, value = self._recv()
        if status != "ok":
            raise RuntimeError(value)
        value.scenario = self.name
        return value

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.conn.send(None)
            except OSError:
                pass
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.conn.close()


def kinds_for(peers: set[str]) -> list[str]:
    """--peers names (inprocess, genai, hf, llamacpp) -> peer kinds, GenAI's out-of-the-box
    precision row included with genai."""
    out = []
    if "inprocess" in peers:
        out.append("inprocess")
    if "genai" in peers:
        out += ["genai-plain", "genai-speculative", "genai-lookup", "genai-plain-oob"]
    if "hf" in peers:
        out += ["hf-plain", "hf-assisted"]
    if "llamacpp" in peers:
        out += ["llamacpp-plain", "llamacpp-speculative"]
    return out


def start_all(peers: set[str], setups: list[str], target_cpu: int | None, options: dict,
              say=print) -> list[PeerProcess]:
    """Every peer kind in every set-up; a peer that cannot start is noted and left out."""
    started = []
    for key in setups:
        for kind in kinds_for(peers):
            try:
                started.append(PeerProcess(kind, SETUPS[key], target_cpu, options))
            except (RuntimeError, TimeoutError, ImportError) as exc:
                say(f"note: peer {kind} ({SETUPS[key].label}) skipped: {exc}")
    return started

"""A Ray cluster of LAN hosts, and the coordinator on it.

`RayCluster(lan, head, workers)` runs `ray start --head --block` on the head host and
`ray start --address HEAD:6379 --block` on each worker host, every node at its LAN
address, with its own temp folder (two nodes on one file system must not share socket
paths), token authentication with one random token for the cluster, and no dashboard.
`coordinator(...)` starts `python -m coordinator --ray-address HEAD:6379` on the head
host: Serve's proxies then listen on every node that has a replica (gRPC on --port, HTTP
on --http-port, all interfaces), which is how clients reach each node.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from coordinator.deploy.config import RAY_ENVIRONMENT
from specdec import launcher
from specdec_tools.netns.lan import Lan, stop_group

log = logging.getLogger(__name__)

GCS_PORT = 6379
COORD_PORT = 50050
HTTP_PORT = 8000


def ray_binary() -> str:
    return str(Path(sys.executable).with_name("ray"))


class Samples:
    """The monitor's samples as they come (a thread reads its JSON lines)."""

    def __init__(self, proc: subprocess.Popen):
        self.proc, self.items = proc, []
        self._cond = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                item = json.loads(line)
            except ValueError:
                continue
            if "t" in item and "error" not in item:
                with self._cond:
                    self.items.append(item)
                    self._cond.notify_all()

    def wait(self, pred, timeout: float) -> dict | None:
        """The first sample from now on for which pred(sample) holds, or None after
        `timeout` seconds."""
        deadline = time.monotonic() + timeout
        with self._cond:
            seen = len(self.items) if self.items else 0
            while True:
                for item in self.items[seen:]:
                    if pred(item):
                        return item
                seen = len(self.items)
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    return None
                self._cond.wait(min(left, 1.0))

    def stop(self) -> list[dict]:
        stop_group(self.proc)
        return list(self.items)


class RayCluster:
    def __init__(self, lan: Lan, head: str, workers: Sequence[str], cpus: int = 2):
        self.lan, self.head, self.workers, self.cpus = lan, head, list(workers), cpus
        self.env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32),
                    "RAY_USAGE_STATS_ENABLED": "0", **RAY_ENVIRONMENT}
        # Short: Ray's socket paths (AF_UNIX, at most 107 bytes) live under it.
        self.tmp = tempfile.mkdtemp(prefix="sdray")
        self.procs: dict[str, subprocess.Popen] = {}
        self.logs: dict[str, Path] = {}

    @property
    def address(self) -> str:
        return f"{self.lan.address(self.head)}:{GCS_PORT}"

    def _start_node(self, node: str, extra: list[str]) -> None:
        folder = Path(self.tmp) / node
        folder.mkdir(parents=True, exist_ok=True)
        self.logs[node] = folder / "ray-start.log"
        out = open(self.logs[node], "w")  # noqa: SIM115 - the process writes it until stop
        self.procs[node] = self.lan.popen(
            node, [ray_binary(), "start", "--block", f"--node-ip-address="
                   f"{self.lan.address(node)}", f"--num-cpus={self.cpus}",
                   f"--temp-dir={folder}", "--disable-usage-stats", *extra],
            env=self.env, stdout=out, stderr=subprocess.STDOUT)

    def start(self, timeout: float = 180.0) -> float:
        """Start the head, then the workers; return once all nodes are alive (seconds)."""
        t0 = time.monotonic()
        self._start_node(self.head, ["--head", f"--port={GCS_PORT}",
                                      "--include-dashboard=false"])
        self.wait_nodes(1, timeout)
        for node in self.workers:
            self._start_node(node, [f"--address={self.address}"])
        self.wait_nodes(1 + len(self.workers), timeout - (time.monotonic() - t0))
        seconds = time.monotonic() - t0
        log.info("ray cluster up in %.1f s: head %s, workers %s", seconds, self.address,
                 ", ".join(self.lan.address(w) for w in self.workers))
        return seconds

    def driver(self, code: str, timeout: float = 120.0) -> str:
        """Run `code` as a Ray driver on the head host (ray.init(ADDRESS) done); its
        stdout."""
        script = f"import ray\nray.init(address={self.address!r}, log_to_driver=False)\n" \
            + code
        run = self.lan.run(self.head, [sys.executable, "-c", script],
                           env={**os.environ, **self.env}, capture_output=True, text=True,
                           timeout=timeout)
        if run.returncode != 0:
            raise RuntimeError(f"ray driver failed ({run.returncode}):\n{run.stderr[-3000:]}")
        return run.stdout

    def alive_nodes(self) -> list[str]:
        out = self.driver("import json\nprint(json.dumps(sorted(n['NodeManagerAddress'] "
                          "for n in ray.nodes() if n['Alive'])))", timeout=60)
        return json.loads(out.strip().splitlines()[-1])

    def wait_nodes(self, n: int, timeout: float) -> None:
        deadline = time.monotonic() + max(timeout, 1.0)
        while True:
            for node, proc in self.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"ray start on {node} exited ({proc.returncode}):\n"
                                       f"{self.logs[node].read_text()[-3000:]}")
            try:
                if len(self.alive_nodes()) >= n:
                    return
            except (RuntimeError, subprocess.TimeoutExpired):
                pass  # the head's GCS is not up yet
            if time.monotonic() > deadline:
                raise TimeoutError(f"fewer than {n} Ray nodes alive after {timeout:.0f} s")
            time.sleep(1.0)

    def coordinator(self, draft: str, target: str, args: Sequence[str] = (),
                    timeout: float = 240.0, echo: bool = False) -> launcher.ServiceProcess:
        """The coordinator's driver on the head host, joined to this cluster; Serve's
        proxies on all interfaces of every node with a replica."""
        return self.lan.start(
            self.head, "coordinator",
            ["--ray-address", self.address, "--draft", draft, "--target", target,
             "--host", "0.0.0.0", "--port", str(COORD_PORT), "--http-host", "0.0.0.0",
             "--http-port", str(HTTP_PORT), "--expose-replicas", *args],
            timeout=timeout, env={**self.env, "TMPDIR": self.tmp}, name="coordinator",
            echo=echo)

    def monitor(self, interval: float = 0.5, timeout: float = 120.0) -> Samples:
        """specdec_tools.scale.monitor on the head host, sampling every `interval` s."""
        proc = self.lan.popen(self.head, [sys.executable, "-m", "specdec_tools.scale.monitor",
                                          self.address, "--interval", str(interval)],
                              env={**self.env, "PYTHONPATH": str(launcher.ROOT)},
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                              cwd=launcher.ROOT)
        samples = Samples(proc)
        samples.wait(lambda x: True, timeout)
        return samples

    def grpc_address(self, node: str) -> str:
        """Serve's gRPC proxy on `node`."""
        return f"{self.lan.address(node)}:{COORD_PORT}"

    def close(self) -> None:
        """Stop the nodes (workers first, as the LAN's teardown would too)."""
        for node in [*self.workers, self.head]:
            if node in self.procs:
                stop_group(self.procs[node], timeout=10)
        shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self) -> RayCluster:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

"""Draft and target pools of hosts behind DNS names, as a Kubernetes headless Service
lists its pods: the hosts on one LAN, the names in the coordinator host's /etc/hosts.

`Pools(lan)` starts replicas (`start("t1", "target")`: the tiny target on host t1),
publishes which replicas each name lists (`publish(draft=[...], target=[...])`, records
of specdec-draft and specdec-target), starts the coordinator on host `coord` with
`--draft dns:specdec-draft:50051 --target dns:specdec-target:50052`, and samples every
replica's Prometheus metrics (what the HPAs read: the target's in-flight Verify
requests, the sessions each holds).
"""

from __future__ import annotations

import re
import threading
import time
import urllib.request
from dataclasses import dataclass, field

from specdec import launcher
from specdec.pair import TINY_PAIR
from specdec_tools.netns.lan import Lan

PORTS = {"draft": 50051, "target": 50052}
METRICS_PORT = 9100
NAMES = {"draft": "specdec-draft", "target": "specdec-target"}
COORD_PORT = 50050
GAUGES = ("specdec_target_inflight_verify_requests", "specdec_target_live_sessions",
          "specdec_draft_live_sessions")


@dataclass
class Replica:
    host: str
    role: str
    address: str
    process: launcher.ServiceProcess
    started_s: float  # from start to ready


@dataclass
class Pools:
    lan: Lan
    dns_refresh: float = 1.0
    grace: float = 10.0
    replicas: dict[str, Replica] = field(default_factory=dict)
    coordinator: launcher.ServiceProcess | None = None
    listed: dict[str, list[str]] = field(default_factory=lambda: {"draft": [], "target": []})

    def start(self, host: str, role: str) -> Replica:
        spec = getattr(TINY_PAIR, role)
        t0 = time.monotonic()
        proc = self.lan.start(host, spec.module, [
            *spec.args(PORTS[role]), "--host", "0.0.0.0", "--metrics-port",
            str(METRICS_PORT), "--grace", str(self.grace)], name=f"{role}@{host}")
        replica = Replica(host, role, f"{self.lan.address(host)}:{PORTS[role]}", proc,
                          time.monotonic() - t0)
        self.replicas[host] = replica
        return replica

    def publish(self, **hosts: list[str]) -> None:
        """The hosts each name lists from now on (draft=[...], target=[...])."""
        for role, names in hosts.items():
            self.listed[role] = list(names)
        self.lan.set_hosts("coord", {NAMES[r]: [self.lan.address(h) for h in hs]
                                     for r, hs in self.listed.items()})

    def stop(self, host: str, kill: bool = False) -> float:
        """SIGTERM (it drains: in-flight calls finish within --grace) or SIGKILL the
        replica on `host`; the seconds until it exited."""
        replica = self.replicas.pop(host)
        t0 = time.monotonic()
        replica.process.stop(9 if kill else 15, timeout=self.grace + 30)
        return time.monotonic() - t0

    def start_coordinator(self, args: list[str] = ()) -> launcher.ServiceProcess:
        self.coordinator = self.lan.start("coord", "coordinator", [
            "--draft", f"dns:{NAMES['draft']}:{PORTS['draft']}",
            "--target", f"dns:{NAMES['target']}:{PORTS['target']}",
            "--dns-refresh", str(self.dns_refresh), "--host", "0.0.0.0", "--port",
            str(COORD_PORT), "--http-port", "0", "--expose-replicas", *args],
            timeout=240, name="coordinator")
        return self.coordinator

    @property
    def address(self) -> str:
        return f"{self.lan.address('coord')}:{COORD_PORT}"

    def metrics(self) -> dict[str, dict[str, float]]:
        """Each live replica's gauges now ({host: {name: value}})."""
        out = {}
        for host in list(self.replicas):
            url = f"http://{self.lan.address(host)}:{METRICS_PORT}/metrics"
            try:
                text = urllib.request.urlopen(url, timeout=2).read().decode()
            except OSError:
                continue
            out[host] = {m.group(1): float(m.group(2)) for m in re.finditer(
                r"^(\w+) ([-0-9.e+]+)$", text, re.M) if m.group(1) in GAUGES}
        return out


class MetricsSampler:
    """Samples `pools.metrics()` every `interval` s in a thread; `peaks()` gives each
    host's largest value of each gauge, `means()` its mean."""

    def __init__(self, pools: Pools, interval: float = 0.5):
        self.pools, self.interval = pools, interval
        self.samples: list[dict] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append(self.pools.metrics())
            self._stop.wait(self.interval)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def summary(self) -> dict[str, dict[str, dict[str, float]]]:
        """{host: {gauge: {"peak": x, "mean": y}}} over the samples that saw the host."""
        values: dict[str, dict[str, list[float]]] = {}
        for sample in self.samples:
            for host, gauges in sample.items():
                for name, v in gauges.items():
                    values.setdefault(host, {}).setdefault(name, []).append(v)
        return {h: {n: {"peak": max(v), "mean": round(sum(v) / len(v), 2)}
                    for n, v in g.items()} for h, g in values.items()}

"""After a load run on a stack started here: did every session go, and how did RSS grow?

The model services get a metrics port each (`--metrics-port`), so their live-session
gauges (SessionStoreCollector) can be read; RSS comes from /proc. `check` waits (a
little) for both services' live sessions to reach 0, the state a finished run must
leave, and reports RSS at the start and at the end of the run for every process.
"""

from __future__ import annotations

import socket
import time
import urllib.request
from pathlib import Path

from specdec.pair import Pair


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def with_metrics_ports(pair: Pair) -> tuple[Pair, dict[str, int]]:
    """The pair with a free metrics port added to each service's flags."""
    ports = {"target": free_port(), "draft": free_port()}
    return Pair(pair.name,
                pair.target.with_(extra=pair.target.extra + ("--metrics-port",
                                                            str(ports["target"]))),
                pair.draft.with_(extra=pair.draft.extra + ("--metrics-port",
                                                          str(ports["draft"])))), ports


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


TARGET_PASSES = "specdec_target_forward_duration_seconds"  # a histogram


def scrape(port: int) -> dict[str, float]:
    """The unlabelled samples a metrics port serves now: {name: value}."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
    out = {}
    for line in text.decode().splitlines():
        parts = line.split()
        if len(parts) == 2 and not line.startswith("#") and "{" not in parts[0]:
            out[parts[0]] = float(parts[1])
    return out


def sample(port: int, name: str) -> float:
    """One unlabelled sample of a metrics port; KeyError if it does not report it."""
    got = scrape(port)
    if name not in got:
        raise KeyError(f"{name} not reported on port {port}")
    return got[name]


def live_sessions(port: int, role: str) -> float:
    return sample(port, f"specdec_{role}_live_sessions")


def histogram_totals(port: int, name: str) -> tuple[float, float]:
    """(sum, count) of histogram `name` on a metrics port: read twice, the difference is
    what happened between (e.g. a service's forward passes and their seconds)."""
    got = scrape(port)
    if name + "_sum" not in got or name + "_count" not in got:
        raise KeyError(f"histogram {name} not reported on port {port}")
    return got[name + "_sum"], got[name + "_count"]


def rss_of(processes: dict[str, int]) -> dict[str, float]:
    return {role: round(rss_mb(pid), 1) for role, pid in processes.items()}


def check(ports: dict[str, int], processes: dict[str, int], rss_start: dict[str, float],
          wait_s: float = 15.0) -> dict:
    """Live sessions per service once they drained (or after `wait_s`), and RSS."""
    deadline = time.monotonic() + wait_s
    while True:
        live = {role: live_sessions(port, role) for role, port in ports.items()}
        if not any(live.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    end = rss_of(processes)
    return {"live_sessions_after": live,
            "rss_mb": {role: [rss_start.get(role), end[role]] for role in end}}


def lines(drain: dict | None) -> list[str]:
    """Markdown lines for the report."""
    if not drain:
        return []
    live = ", ".join(f"{r} {int(v)}" for r, v in drain["live_sessions_after"].items())
    rss = ", ".join(f"{r} {a:.0f} -> {b:.0f} MB (+{b - a:.0f})"
                    for r, (a, b) in drain["rss_mb"].items())
    return [f"Live sessions after the run: {live}.", f"RSS from start to end: {rss}."]

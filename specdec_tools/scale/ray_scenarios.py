"""The scale-out runs that need a multi-node Ray cluster: replicas on two nodes, and
Serve's autoscaling under a load ramp. Each returns a report (a dict, JSON-ready).

The hosts, on one LAN (specdec_tools.netns.lan): `head` and `worker` (the Ray nodes, a
coordinator replica on each), `draft` and `target` (the tiny model pair, one replica
each). The root namespace is the client: it dials Serve's gRPC proxy on each node.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass

from specdec.pair import TINY_PAIR
from specdec_tools.netns.lan import Lan
from specdec_tools.scale import load
from specdec_tools.scale.cluster import RayCluster

log = logging.getLogger(__name__)

HOSTS = ["head", "worker", "draft", "target"]
PORTS = {"draft": 50051, "target": 50052}


@dataclass(frozen=True)
class Size:
    """How long a run is: CI's short form, or the full one (`make test-scale`)."""

    prompts: int
    max_new_tokens: int
    multinode_s: float  # load on both proxies
    base_s: float  # autoscaling: one stream before the ramp
    peak_streams: int
    hold_s: float  # autoscaling: the peak held once every replica runs
    max_replicas: int


SHORT = Size(prompts=8, max_new_tokens=48, multinode_s=6, base_s=4, peak_streams=16,
             hold_s=4, max_replicas=3)
FULL = Size(prompts=16, max_new_tokens=96, multinode_s=30, base_s=15, peak_streams=16,
            hold_s=20, max_replicas=4)


def _pair(stack: ExitStack, lan: Lan) -> tuple[str, str]:
    """The tiny draft and target on their hosts; their addresses."""
    for role in ("target", "draft"):
        spec = getattr(TINY_PAIR, role)
        stack.callback(lan.start(role, spec.module, [*spec.args(PORTS[role]), "--host",
                                                     "0.0.0.0"], name=role).stop)
    return (f"{lan.address('draft')}:{PORTS['draft']}",
            f"{lan.address('target')}:{PORTS['target']}")


def _checked(outcomes, refs) -> dict:
    c = load.check(outcomes, refs)
    return {"generations": c.generations, "errors": c.errors[:20],
            "mismatches": c.mismatches[:20], "exact": not c.mismatches}


def multinode(size: Size = SHORT) -> dict:
    """Two Ray nodes, a coordinator replica on each (--max-replicas-per-node 1), clients
    on both nodes' proxies; every output against target-only."""
    with Lan(HOSTS) as lan, ExitStack() as stack:
        draft, target = _pair(stack, lan)
        prompts = load.prompts(size.prompts)
        refs = load.references(target, prompts, size.max_new_tokens)
        cluster = stack.enter_context(RayCluster(lan, "head", ["worker"]))
        t0 = time.monotonic()
        coord = cluster.coordinator(draft, target, ["--min-replicas", "2", "--max-replicas",
                                                    "2", "--max-replicas-per-node", "1"])
        stack.callback(coord.stop)
        coordinator_s = time.monotonic() - t0
        monitor = cluster.monitor()
        placed = monitor.wait(lambda s: s["running"] >= 2, 60) or {}
        proxies = [cluster.grpc_address(n) for n in ("head", "worker")]
        streams = load.Streams(proxies, prompts, size.max_new_tokens)
        streams.resize(4)
        time.sleep(size.multinode_s)
        outcomes = streams.stop()
        monitor.stop()
        served = Counter((o.via, o.node) for o in outcomes if not o.error)
        return {
            "nodes": cluster.alive_nodes(),
            "replicas_per_node": placed.get("nodes", {}),
            "coordinator_start_s": round(coordinator_s, 1),
            "served": [{"proxy": via, "node": node, "generations": n}
                       for (via, node), n in sorted(served.items())],
            "nodes_serving": sorted({o.node for o in outcomes if o.node}),
            "proxy_refusals": streams.refused,
            **_checked(outcomes, refs),
        }


def autoscale(size: Size = SHORT) -> dict:
    """1 -> peak -> 1 streams against a coordinator with 1..max replicas (target 2
    ongoing requests each, short delays): replicas over time, the time to scale up (until
    Serve starts a replica, until it runs, until all run) and down, and every generation
    checked."""
    with Lan(HOSTS) as lan, ExitStack() as stack:
        draft, target = _pair(stack, lan)
        prompts = load.prompts(size.prompts)
        refs = load.references(target, prompts, size.max_new_tokens)
        cluster = stack.enter_context(RayCluster(lan, "head", ["worker"]))
        per_node = -(-size.max_replicas // 2)
        coord = cluster.coordinator(draft, target, [
            "--min-replicas", "1", "--max-replicas", str(size.max_replicas),
            "--target-ongoing-requests", "2", "--upscale-delay", "1", "--downscale-delay",
            "4", "--autoscale-look-back", "2", "--max-replicas-per-node", str(per_node),
            "--graceful-shutdown-timeout", "60"])
        stack.callback(coord.stop)
        monitor = cluster.monitor()
        monitor.wait(lambda s: s["running"] >= 1, 60)
        proxies = [cluster.grpc_address(n) for n in ("head", "worker")]
        streams = load.Streams(proxies, prompts, size.max_new_tokens)
        marks = {}
        streams.resize(1)
        time.sleep(size.base_s)
        marks["up"] = time.monotonic()
        streams.resize(size.peak_streams)
        decided = monitor.wait(lambda s: sum(s["states"].values()) >= 2, 120)
        first = monitor.wait(lambda s: s["running"] >= 2, 120)
        full = monitor.wait(lambda s: s["running"] >= size.max_replicas, 120)
        time.sleep(size.hold_s)
        marks["down"] = time.monotonic()
        streams.resize(1)
        back = monitor.wait(lambda s: s["running"] <= 1 and not s["states"].get("STOPPING")
                            and sum(s["nodes"].values()) <= 1, 180)
        time.sleep(1.0)
        outcomes = streams.stop()
        samples = monitor.stop()
        return {
            "min_replicas": 1, "max_replicas": size.max_replicas,
            "streams": [1, size.peak_streams, 1],
            "scale_up_decided_s": _since(decided, marks["up"]),
            "scale_up_first_s": _since(first, marks["up"]),
            "scale_up_full_s": _since(full, marks["up"]),
            "scale_down_s": _since(back, marks["down"]),
            "peak_running": max((s["running"] for s in samples), default=0),
            "timeline": _timeline(samples, marks),
            "drain_s": _drains(samples),
            "proxy_refusals": streams.refused,
            **_checked(outcomes, refs),
        }


def _since(sample: dict | None, t0: float) -> float | None:
    return None if sample is None else round(sample["t"] - t0, 1)


def _timeline(samples: list[dict], marks: dict) -> list[dict]:
    """The samples where something changed: seconds from the ramp's start, replicas
    running, per node, and states."""
    out, last = [], None
    t0 = marks["up"]
    for s in samples:
        key = (s["running"], tuple(sorted(s["nodes"].items())),
               tuple(sorted(s["states"].items())))
        if key != last:
            out.append({"t": round(s["t"] - t0, 1), "running": s["running"],
                        "nodes": s["nodes"], "states": s["states"]})
            last = key
    return out


def _drains(samples: list[dict]) -> list[float]:
    """How long each stretch with a replica STOPPING lasted (a draining replica finishes
    the generations it has), in seconds."""
    out, since = [], None
    for s in samples:
        stopping = s["states"].get("STOPPING", 0) > 0
        if stopping and since is None:
            since = s["t"]
        elif not stopping and since is not None:
            out.append(round(s["t"] - since, 1))
            since = None
    return out

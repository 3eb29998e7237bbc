"""Pools of different sizes behind DNS names, and rolling replacement under load. Each
returns a report (a dict, JSON-ready).

The hosts, on one LAN: `coord` (the coordinator, Ray embedded), d1..d3 and t1..t3 (tiny
draft and target replicas, one a host, as pods are). Client streams run from the root
namespace the whole time; every generation is checked against target-only output, and
its stats say which draft and target replicas it was pinned to, in order.
"""

from __future__ import annotations

import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass

from specdec_tools.netns.lan import Lan
from specdec_tools.scale import load
from specdec_tools.scale.pools import MetricsSampler, Pools

HOSTS = ["coord", "d1", "d2", "d3", "t1", "t2", "t3"]
STREAMS = 8
DNS_MARGIN_S = 0.5  # past --dns-refresh before a phase that follows a publish starts


@dataclass(frozen=True)
class Size:
    prompts: int
    max_new_tokens: int
    phase_s: float  # load per phase of the pools run
    settle_s: float  # between a replacement's steps


SHORT = Size(prompts=8, max_new_tokens=48, phase_s=5, settle_s=2)
FULL = Size(prompts=16, max_new_tokens=96, phase_s=20, settle_s=5)


def _start(pools: Pools, *pairs: tuple[str, str]) -> dict[str, float]:
    with ThreadPoolExecutor(len(pairs)) as ex:
        done = list(ex.map(lambda hr: pools.start(*hr), pairs))
    return {r.host: round(r.started_s, 1) for r in done}


def _phase(outcomes, refs, since: float, until: float, host_of: dict[str, str]) -> dict:
    """The generations that started in [since, until): checked, and who served them."""
    mine = [o for o in outcomes if since <= o.started < until]
    c = load.check(mine, refs)
    ok = [o for o in mine if not o.error]
    return {
        "generations": c.generations, "errors": c.errors[:10], "mismatches": c.mismatches[:10],
        "by_draft": dict(Counter(host_of.get(o.drafts[0], o.drafts[0]) if o.drafts else "none"
                                 for o in ok)),
        "by_target": dict(Counter(host_of.get(o.targets[0], o.targets[0]) for o in ok
                                  if o.targets)),
        "draft_repinned": sum(len(o.drafts) > 1 for o in ok),
        "target_repinned": sum(len(o.targets) > 1 for o in ok),
    }


def _host_of(lan: Lan) -> dict[str, str]:
    return {f"{lan.address(h)}:{p}": h for h in HOSTS[1:] for p in (50051, 50052)}


def pools(size: Size = SHORT) -> dict:
    """2 drafts with 1 target, then 1 draft with 2 targets, a target killed, a target
    added: how generations spread and re-pin, and per-replica load in the metrics."""
    with Lan(HOSTS) as lan, ExitStack() as stack:
        p = Pools(lan)
        started = _start(p, ("d1", "draft"), ("d2", "draft"), ("t1", "target"),
                         ("t2", "target"))
        p.publish(draft=["d1", "d2"], target=["t1"])
        prompts = load.prompts(size.prompts)
        refs = load.references(p.replicas["t1"].address, prompts, size.max_new_tokens)
        stack.callback(p.start_coordinator().stop)
        sampler = MetricsSampler(p)
        streams = load.Streams([p.address], prompts, size.max_new_tokens)
        streams.resize(STREAMS)
        marks = [("2 drafts : 1 target", time.monotonic())]
        time.sleep(size.phase_s)
        # Kubernetes scales the draft Deployment down and the target one up. The phase
        # starts once the coordinator must have looked the names up again (every
        # --dns-refresh s): a generation that starts before then may be pinned to d2,
        # which its last lookup still listed, and Kubernetes' own endpoint updates lag
        # likewise (a pod's preStop covers that window).
        p.publish(draft=["d1"], target=["t1", "t2"])
        time.sleep(p.dns_refresh + DNS_MARGIN_S)
        marks.append(("1 draft : 2 targets (d2 left the draft list)", time.monotonic()))
        time.sleep(size.phase_s)
        p.stop("t2", kill=True)
        marks.append(("t2 killed (SIGKILL), still listed", time.monotonic()))
        time.sleep(size.phase_s / 2)
        p.publish(target=["t1"])  # its endpoint goes
        started.update(_start(p, ("t3", "target")))
        p.publish(target=["t1", "t3"])
        marks.append(("t3 added", time.monotonic()))
        time.sleep(size.phase_s)
        outcomes = streams.stop()
        sampler.stop()
        ends = [t for _, t in marks[1:]] + [float("inf")]
        host_of = _host_of(lan)
        phases = [{"phase": name, **_phase(outcomes, refs, t0, t1, host_of)}
                  for (name, t0), t1 in zip(marks, ends, strict=True)]
        c = load.check(outcomes, refs)
        return {"start_s": started, "phases": phases, "generations": c.generations,
                "errors": c.errors[:20], "mismatches": c.mismatches[:20],
                "exact": not c.mismatches, "metrics": sampler.summary()}


def rolling(size: Size = SHORT) -> dict:
    """While 8 streams run, replace each target replica, then each draft replica: start
    the new one, wait for ready, list it, unlist the old one, wait for the coordinator to
    move off it (a pod's preStop), SIGTERM it (it drains), measure."""
    with Lan(HOSTS) as lan, ExitStack() as stack:
        p = Pools(lan)
        _start(p, ("d1", "draft"), ("d2", "draft"), ("t1", "target"), ("t2", "target"))
        p.publish(draft=["d1", "d2"], target=["t1", "t2"])
        prompts = load.prompts(size.prompts)
        refs = load.references(p.replicas["t1"].address, prompts, size.max_new_tokens)
        stack.callback(p.start_coordinator().stop)
        streams = load.Streams([p.address], prompts, size.max_new_tokens)
        streams.resize(STREAMS)
        time.sleep(size.settle_s)
        steps = []
        for role, old, new in (("target", "t1", "t3"), ("target", "t2", "t1"),
                               ("draft", "d1", "d3"), ("draft", "d2", "d1")):
            t0 = time.monotonic()
            replica = p.start(new, role)
            p.publish(**{role: [h for h in p.listed[role] if h != old] + [new]})
            time.sleep(p.dns_refresh * 2 + 0.5)  # preStop: the coordinator moves first
            drain = p.stop(old)
            steps.append({"role": role, "old": old, "new": new,
                          "new_ready_s": round(replica.started_s, 1),
                          "drain_s": round(drain, 2),
                          "step_s": round(time.monotonic() - t0, 1)})
            time.sleep(size.settle_s)
        outcomes = streams.stop()
        c = load.check(outcomes, refs)
        ok = [o for o in outcomes if not o.error]
        return {"replacements": steps, "generations": c.generations,
                "errors": c.errors[:20], "mismatches": c.mismatches[:20],
                "exact": not c.mismatches,
                "target_repinned": sum(len(o.targets) > 1 for o in ok),
                "draft_repinned": sum(len(o.drafts) > 1 for o in ok)}

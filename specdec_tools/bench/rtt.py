"""RTT sweep: sequential vs pipelined rounds as the network between services slows.

Every Propose and Verify pays the added round-trip time, target-only decoding included
(one Verify per token), so the speedups are what draft and target on other hosts would
see. How the RTT is added (`method`, recorded in every row and in the Markdown):

- "netns": where network namespaces can be made
  (specdec_tools.netns.network.namespaces_permitted) and
  the caller says which `pair` to run, the sweep starts its own target and draft, each in
  its own network namespace with a veth link to the root namespace, where this process
  (and the coordinator loop, built in-process by build_service) runs and dials them over
  the links. The RTT goes on each link: netem where the kernel has it, else a
  specdec_tools.delay_proxy in the service's namespace in front of the service (RTT/2 each
  way; it listens on the link address, the service on the namespace's loopback). 0 ms
  is that same path with nothing added. The services at `target`/`draft` are not used.
- "sleeps": otherwise, the services at `target`/`draft` and the coordinator's in-client
  sleeps (`--inject-rtt-ms`): half the RTT before and after every call, on loopback.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from specdec_tools.bench import harness
from specdec_tools.bench.system import BASELINE, SystemScenario

log = logging.getLogger(__name__)

SLEEPS = "in-client sleeps (coordinator --inject-rtt-ms, loopback)"
PORTS = {"target": 50052, "draft": 50051}


@dataclass
class RttRow:
    rtt_ms: float
    target_only_tokens_per_s: float
    sequential_tokens_per_s: float
    pipelined_tokens_per_s: float
    sequential_speedup: float  # harness.SPEEDUP_DEFINITION, target-only at this RTT
    pipelined_speedup: float
    method: str = ""  # how the RTT was added; "" in results from before it was recorded


def choose_method(pair, method: str = "auto") -> tuple[str, str]:
    """("netns" or "sleeps", why): `method` "auto" takes netns when namespaces can be
    made and a pair to start in them is given; "netns" insists (ValueError if it cannot);
    "sleeps" never uses namespaces."""
    from specdec_tools.netns.network import namespaces_permitted

    if method not in ("auto", "netns", "sleeps"):
        raise ValueError(f"unknown RTT method {method!r} (auto, netns or sleeps)")
    if method == "sleeps":
        return "sleeps", "asked for"
    ok, why = namespaces_permitted()
    if ok and pair is None:
        ok, why = False, "no pair to start in namespaces was given (sweep(..., pair=...))"
    if not ok and method == "netns":
        raise ValueError(f"the RTT sweep cannot use network namespaces: {why}")
    return ("netns", "") if ok else ("sleeps", why)


@contextmanager
def namespace_pair(pair, pin: bool = True, timeout: float = 300.0
                   ) -> Iterator[dict]:
    """`pair`'s target and draft, each in its own namespace linked to this (the root)
    one; yields {"target": Endpoint, "draft": Endpoint} (specdec_tools.netns.services)."""
    from specdec import pair as pairs
    from specdec_tools.netns.network import ROOT, Network
    from specdec_tools.netns.services import start_service

    cpus = pairs.placement(pin)
    with ExitStack() as stack:
        net = stack.enter_context(Network(["target", "draft"],
                                          [(ROOT, "target"), (ROOT, "draft")]))

        def start(role: str):
            spec = getattr(pair, role)
            return start_service(net, role, ROOT, spec.module,
                                 spec.args(PORTS[role], cpus[role]), PORTS[role],
                                 timeout=timeout, name=role)

        with ThreadPoolExecutor(2) as pool:  # both load their models at once
            started = {role: pool.submit(start, role) for role in ("target", "draft")}
        yield {role: f.result() for role, f in started.items()}


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def sweep(target: str, draft: str, rtts: list[float], messages: list[str], k: int,
          max_new_tokens: int, progress=lambda x: x, *, pair=None, pin: bool = True,
          method: str = "auto", jitter_ms: float = 0.0,
          say: Callable[[str], None] = _say) -> list[RttRow]:
    """Target-only, sequential and pipelined K at each RTT in `rtts`; see the module
    docstring for `pair`, `pin` (CPU placement of the pair's services) and `method`."""
    chosen, why = choose_method(pair, method)
    if chosen == "sleeps":
        say(f"RTT sweep: RTT added by {SLEEPS}" + (f"; not namespaces: {why}" if why else ""))
        return _sweep(target, draft, rtts, messages, k, max_new_tokens, progress,
                      lambda _rtt: None, SLEEPS, jitter_ms, inject=True)
    with namespace_pair(pair, pin) as eps:
        label = f"network namespaces, {eps['target'].method} on each link"
        say(f"RTT sweep: target at {eps['target'].address}, draft at "
            f"{eps['draft'].address}, each in its own network namespace; RTT added by "
            f"{eps['target'].method}")

        def set_rtt(rtt: float) -> None:
            for ep in eps.values():
                ep.set_rtt(rtt, jitter_ms)

        return _sweep(eps["target"].address, eps["draft"].address, rtts, messages, k,
                      max_new_tokens, progress, set_rtt, label, jitter_ms, inject=False)


def _sweep(target: str, draft: str, rtts, messages, k: int, max_new_tokens: int, progress,
           set_rtt, label: str, jitter_ms: float, inject: bool) -> list[RttRow]:
    from coordinator.deploy.config import CoordinatorConfig
    from coordinator.deploy.setup import build_service

    rows = []
    for rtt in progress(rtts):
        set_rtt(rtt)

        def service(pipeline: bool, rtt: float = rtt):
            extra = dict(inject_rtt_ms=rtt, inject_jitter_ms=jitter_ms) if inject else {}
            return build_service(CoordinatorConfig(target=target, draft=draft, pipeline=pipeline,
                                                   drafter="model", **extra))

        scenarios = [SystemScenario(service(False), 0), SystemScenario(service(False), k),
                     SystemScenario(service(True), k, " pipelined")]
        samples = harness.run_side_by_side(scenarios, messages, max_new_tokens,
                                           desc=f"rtt {rtt:g} ms")
        seq, pipe = scenarios[1].name, scenarios[2].name
        rows.append(RttRow(rtt, harness.median_tps(samples, BASELINE),
                           harness.median_tps(samples, seq), harness.median_tps(samples, pipe),
                           harness.speedup(samples, seq, BASELINE),
                           harness.speedup(samples, pipe, BASELINE), label))
    return rows


def markdown(rows: list[RttRow], k: int) -> str:
    methods = sorted({r.method for r in rows if r.method})
    title = "added RTT sweep" if methods else "injected RTT sweep"
    out = [f"### {title} (greedy, K={k})", "",
           "| RTT ms | target-only tok/s | sequential tok/s | pipelined tok/s | "
           "sequential speedup | pipelined speedup |", "|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r.rtt_ms:g} | {r.target_only_tokens_per_s:.1f} | "
                   f"{r.sequential_tokens_per_s:.1f} | {r.pipelined_tokens_per_s:.1f} | "
                   f"{r.sequential_speedup:.2f}x | {r.pipelined_speedup:.2f}x |")
    if methods:  # results from before the method was recorded render as they did
        out += ["", f"RTT added by: {'; '.join(methods)}."]
    return "\n".join(out) + "\n"


def plot(rows: list[RttRow], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    x = [r.rtt_ms for r in rows]
    ax.plot(x, [r.sequential_speedup for r in rows], "o-", label="sequential rounds")
    ax.plot(x, [r.pipelined_speedup for r in rows], "s-", label="pipelined rounds")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xlabel("added round-trip time per RPC (ms)")
    ax.set_ylabel("speedup over target-only at the same RTT")
    methods = sorted({r.method for r in rows if r.method})
    ax.set_title("speedup vs network round-trip time (greedy)"
                 + (f"\nRTT by {'; '.join(methods)}" if methods else ""), fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def as_dicts(rows: list[RttRow]) -> list[dict]:
    return [asdict(r) for r in rows]

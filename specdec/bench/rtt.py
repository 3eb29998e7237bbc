"""RTT sweep: sequential vs pipelined rounds as the network between services slows.

Every Propose and Verify pays an injected round-trip time (the coordinator's
`--inject-rtt-ms`), target-only decoding included (one Verify per token), so the
speedups are what draft and target on other hosts would see.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from specdec.bench import harness
from specdec.bench.system import BASELINE, SystemScenario


@dataclass
class RttRow:
    rtt_ms: float
    target_only_tokens_per_s: float
    sequential_tokens_per_s: float
    pipelined_tokens_per_s: float
    sequential_speedup: float  # harness.SPEEDUP_DEFINITION, target-only at this RTT
    pipelined_speedup: float


def sweep(target: str, draft: str, rtts: list[float], messages: list[str], k: int,
          max_new_tokens: int, progress=lambda x: x) -> list[RttRow]:
    from coordinator.config import CoordinatorConfig
    from coordinator.setup import build_service

    rows = []
    for rtt in progress(rtts):
        def service(pipeline: bool, rtt: float = rtt):
            return build_service(CoordinatorConfig(target=target, draft=draft, pipeline=pipeline,
                                                   inject_rtt_ms=rtt))

        scenarios = [SystemScenario(service(False), 0), SystemScenario(service(False), k),
                     SystemScenario(service(True), k, " pipelined")]
        samples = harness.run_side_by_side(scenarios, messages, max_new_tokens,
                                           desc=f"rtt {rtt:g} ms")
        seq, pipe = scenarios[1].name, scenarios[2].name
        rows.append(RttRow(rtt, harness.median_tps(samples, BASELINE),
                           harness.median_tps(samples, seq), harness.median_tps(samples, pipe),
                           harness.speedup(samples, seq, BASELINE),
                           harness.speedup(samples, pipe, BASELINE)))
    return rows


def markdown(rows: list[RttRow], k: int) -> str:
    out = [f"### injected RTT sweep (greedy, K={k})", "",
           "| RTT ms | target-only tok/s | sequential tok/s | pipelined tok/s | "
           "sequential speedup | pipelined speedup |", "|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r.rtt_ms:g} | {r.target_only_tokens_per_s:.1f} | "
                   f"{r.sequential_tokens_per_s:.1f} | {r.pipelined_tokens_per_s:.1f} | "
                   f"{r.sequential_speedup:.2f}x | {r.pipelined_speedup:.2f}x |")
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
    ax.set_xlabel("injected round-trip time per RPC (ms)")
    ax.set_ylabel("speedup over target-only at the same RTT")
    ax.set_title("speedup vs network round-trip time (greedy)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def as_dicts(rows: list[RttRow]) -> list[dict]:
    return [asdict(r) for r in rows]

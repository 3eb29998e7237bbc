"""`specdec soak`: many concurrent client streams for minutes while services are killed and
restarted, then checks that nothing went wrong that was not designed to.

One draft, two target replicas and a Ray Serve coordinator (`--target A,B`) run as real
processes on loopback (specdec_tools.soak.faults, which also says the fault schedule and why
each outcome is designed). Before any fault, the greedy catalogue is referenced by
target-only greedy decoding on the same services (specdec_tools.soak.load). Then `--streams`
client streams run for `--duration-s` while the three faults are injected. The verdict
(specdec_tools.soak.report) checks every completed greedy output against its reference, every
error against the designed ones, every service's sessions back to 0, and RSS growth.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from specdec_tools.soak.faults import DEFAULT_FAULT_AT, FaultInjector, Topology, rss_mib
from specdec_tools.soak.load import Mix, Streams

log = logging.getLogger("specdec_tools.soak.cli")


@dataclass
class SoakConfig:
    # "real" (specdec.pair.DEFAULT_PAIR) | "tiny" (TINY_PAIR) | a name in pair.SERVED
    models: str = "real"
    streams: int = 32
    duration_s: float = 120.0
    lengths: list[int] = field(default_factory=lambda: [8, 16, 32, 64])
    greedy_fraction: float = 0.5
    cancel_fraction: float = 0.15
    stop_fraction: float = 0.3
    catalogue: int = 12
    seed: int = 1
    fault_at: tuple[float, ...] = DEFAULT_FAULT_AT
    faults: bool = True
    max_concurrency: int | None = None  # the coordinator's cap; None = streams
    rss_growth_mib: float = 100.0
    timeout_s: float = 300.0
    drain_s: float = 15.0
    pin: bool = True
    progress_s: float = 10.0
    log_dir: str | None = None  # write every process's output there


SHORT = dict(models="tiny", streams=12, duration_s=40.0, lengths=[8, 24, 64, 128])
FULL_TINY_LENGTHS = [8, 24, 64, 128, 256]


def pair_for(models: str, say=log.info):
    from specdec import pair

    if models == "tiny":
        return pair.TINY_PAIR
    if models in pair.SERVED and models != "smollm2":
        from specdec.model_pairs import PAIRS, prepare_pair

        say(f"preparing the {models} pair and its OpenVINO IRs (cached under $SPECDEC_HOME)")
        prepare_pair(PAIRS[models], log=say)
        return pair.SERVED[models]
    from specdec.prepare import prepare_smollm2
    from specdec.runtime.openvino_export import export

    say("preparing SmolLM2-135M and its OpenVINO IRs (cached under $SPECDEC_HOME)")
    hf = prepare_smollm2()
    for weights in ("fp32", "int8"):
        export(hf, weights, say=say)
    return pair.DEFAULT_PAIR


class Rss:
    """RSS snapshots of every process, by (label, pid), in time order."""

    def __init__(self, topo: Topology, clock):
        self.topo, self.clock = topo, clock
        self.series: dict[tuple[str, int], list[tuple[str, float, float]]] = {}
        # A model service's KV block pool (its metrics' kv_pool_bytes) at each snapshot:
        # memory it keeps by design (a paged pool doubles and never shrinks), which the
        # RSS check subtracts.
        self.pool: dict[tuple[str, int], list[tuple[float, float]]] = {}
        self._lock = threading.Lock()

    def snap(self, when: str) -> None:
        t = self.clock()
        pools = {s.name: s.kv_pool_mib() for s in self.topo.services if s.alive()}
        with self._lock:
            for label, pid in self.topo.processes().items():
                mib = rss_mib(pid)
                if mib is not None:
                    self.series.setdefault((label, pid), []).append((when, round(t, 1), mib))
                    if pools.get(label) is not None:
                        self.pool.setdefault((label, pid), []).append((round(t, 1),
                                                                       pools[label]))


def soak(cfg: SoakConfig, say=log.info) -> dict:
    """Run the soak; the figures and the verdict (specdec_tools.soak.report.verdict)."""
    from specdec_tools.soak import report as soak_report
    pair = pair_for(cfg.models, say)
    cap = cfg.max_concurrency or cfg.streams
    topo = Topology.plan(pair, cfg.pin)
    started = time.monotonic()
    t0 = started  # the run's clock starts when the streams do
    rss = Rss(topo, lambda: time.monotonic() - t0)
    try:
        say(f"starting draft, targets A and B ({pair.name}) and the coordinator")
        topo.start(cap, ["--model", pair.target.model])  # the tokenizer, as `up` names it
        rss.snap("ready")
        mix = Mix(cfg.lengths, cfg.seed, cfg.greedy_fraction, cfg.cancel_fraction,
                  cfg.stop_fraction, cfg.catalogue)
        mix.reference(topo.address, cfg.timeout_s, say=say)
        t0 = time.monotonic()
        rss.snap("warm")
        faults = FaultInjector(topo, cfg.duration_s, cfg.fault_at,
                               rss_hook=rss.snap)
        streams = Streams(topo.address, mix, cfg.streams, cfg.duration_s, cfg.timeout_s)
        say(f"soak: {cfg.streams} streams for {cfg.duration_s:.0f} s, faults "
            + (", ".join(f"{f.name} ({f.service}) at {f.planned_s:.1f} s"
                         for f in faults.faults) if cfg.faults else "off"))
        streams.start(t0)
        if cfg.faults:
            faults.start(t0)
        _progress(cfg, streams, faults, rss, say)
        faults.join(timeout=600)
        drained = streams.join(cfg.timeout_s + 60)
        ended_s = time.monotonic() - t0
        say(f"all streams done at {ended_s:.1f} s" if drained else
            f"{streams.running()} stream(s) still running at {ended_s:.1f} s")
        sessions = _drain(topo, cfg.drain_s)
        rss.snap("end")
        figures = soak_report.figures(cfg, cap, streams.snapshot(), mix, faults, rss,
                                      sessions, ended_s, drained, topo.coordinator_errors())
    finally:
        say("stopping the services")
        topo.stop(Path(cfg.log_dir) if cfg.log_dir else None)
    figures["wall_s"] = round(time.monotonic() - started, 1)
    return figures


def _progress(cfg: SoakConfig, streams: Streams, faults: FaultInjector, rss: Rss,
              say) -> None:
    """A progress line every cfg.progress_s (and a bar on a terminal) until the run's end;
    an RSS snapshot with each."""
    bar = None
    if sys.stderr.isatty():
        from tqdm import tqdm

        bar = tqdm(total=int(cfg.duration_s), desc="soak", unit="s", leave=False)
    last_line = 0.0
    while (now := streams.clock()) < cfg.duration_s:
        time.sleep(min(1.0, max(0.05, cfg.duration_s - now)))
        now = streams.clock()
        outs = streams.snapshot()
        status = Counter(o.status for o in outs)
        codes = Counter(o.code for o in outs if o.code)
        if bar is not None:
            bar.n = min(int(now), bar.total)
            bar.set_postfix_str(f"done={len(outs)} failed={status['failed']}")
            bar.refresh()
        if now - last_line >= cfg.progress_s or now >= cfg.duration_s:
            last_line = now
            rss.snap(f"t={now:.0f}s")
            done = [f"{f.name}@{f.at_s:.1f}s" for f in faults.faults if f.at_s is not None]
            line = (f"t={now:5.1f}/{cfg.duration_s:.0f} s: {len(outs)} generations "
                    f"({status['completed']} completed, {status['cancelled']} cancelled, "
                    f"{status['failed']} failed{_codes(codes)}), {streams.running()} "
                    f"streams; faults so far: {', '.join(done) or 'none'}")
            (bar.write if bar is not None else say)(line)
    if bar is not None:
        bar.close()


def _codes(codes: Counter) -> str:
    return (": " + ", ".join(f"{c} {n}" for c, n in codes.most_common())) if codes else ""


def _drain(topo: Topology, wait_s: float) -> dict:
    """Live sessions of every running service and the coordinator's active generations,
    once all are 0 or after `wait_s`."""
    deadline = time.monotonic() + wait_s
    while True:
        counts = {s.name: s.sessions() for s in topo.services}
        counts["coordinator (active generations)"] = topo.active_generations()
        if not any(counts.values()) or time.monotonic() > deadline:
            return counts
        time.sleep(0.25)


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(x) for x in text.split(",") if x.strip())


def add_parser(sub) -> None:
    p = sub.add_parser(
        "soak", help="concurrent streams for minutes while services are killed and restarted",
        description="Start one draft, two target replicas and a Ray Serve coordinator "
                    "(--target A,B) on loopback; reference a catalogue of greedy requests "
                    "by target-only greedy decoding; then run --streams concurrent client "
                    "streams (mixed greedy and sampled, mixed max_new_tokens, stop strings, "
                    "some cancelled on purpose) for --duration-s while: the draft is killed "
                    "(-9) and restarted on its port, target A is killed (-9) and left dead, "
                    "target B gets SIGTERM and is restarted on its port (no target is left "
                    "until it is back: UNAVAILABLE is designed then). Passes when every "
                    "completed greedy output equals its reference, every completed output "
                    "is well-formed, every error is a designed one (UNAVAILABLE while no "
                    "target is left, RESOURCE_EXHAUSTED past the coordinator's cap while "
                    "cancelled generations still hold slots; a deliberate cancellation is "
                    "counted as cancelled, never as an error), every service holds 0 "
                    "sessions at the end, generations completed after the last recovery, "
                    "and RSS grew less than --rss-growth-mib. Prints the figures; exit 1 "
                    "when a check fails.",
        epilog="--short is the CI form (make test): tiny models, 12 streams, 40 s, "
               "lengths 8,24,64,128.")
    d = SoakConfig()
    p.add_argument("--short", action="store_true",
                   help="the short form: --models tiny --streams 12 --duration-s 40 "
                        "--lengths 8,24,64,128 (flags given as well override it)")
    p.add_argument("--models", choices=["real", "tiny", "qwen2.5-coder"], default=None,
                   help="real = the default pair (specdec.pair.DEFAULT_PAIR: SmolLM2-135M, "
                        "OpenVINO fp32 target, int8 draft; prepared under $SPECDEC_HOME as "
                        "`specdec prepare` does); tiny = the in-process tiny test models on "
                        "torch; qwen2.5-coder = the pair `specdec up --pair qwen2.5-coder` "
                        "serves (prepared as `specdec prepare --pair` does) "
                        f"(default: {d.models})")
    p.add_argument("--streams", type=int, default=None,
                   help=f"concurrent client streams (default: {d.streams})")
    p.add_argument("--duration-s", type=float, default=None,
                   help="seconds the streams send requests; requests running then finish "
                        f"(default: {d.duration_s:.0f})")
    p.add_argument("--lengths", default=None,
                   help="max_new_tokens values, comma-separated, drawn at random (default: "
                        f"{','.join(map(str, d.lengths))}; tiny: "
                        f"{','.join(map(str, FULL_TINY_LENGTHS))})")
    p.add_argument("--greedy-fraction", type=float, default=d.greedy_fraction,
                   help="share of greedy requests; the rest sample at temperature 0.8 "
                        "(default: %(default)s)")
    p.add_argument("--cancel-fraction", type=float, default=d.cancel_fraction,
                   help="share of requests the client cancels after 1-3 chunks "
                        "(default: %(default)s)")
    p.add_argument("--stop-fraction", type=float, default=d.stop_fraction,
                   help="share of sampled requests with a stop string (half the greedy "
                        "catalogue has one) (default: %(default)s)")
    p.add_argument("--catalogue", type=int, default=d.catalogue,
                   help="distinct greedy requests (prompt, length), each referenced before "
                        "the run, every second one also with a stop string "
                        "(default: %(default)s)")
    p.add_argument("--seed", type=int, default=d.seed,
                   help="seed of the request mix (default: %(default)s)")
    p.add_argument("--fault-at", default=",".join(map(str, d.fault_at)),
                   help="when draft-kill, target-kill and target-restart happen, as "
                        "fractions of --duration-s (default: %(default)s)")
    p.add_argument("--no-faults", action="store_true",
                   help="run without faults (a fault-free baseline)")
    p.add_argument("--max-concurrency", type=int, default=None,
                   help="the coordinator's --max-concurrency (default: --streams)")
    p.add_argument("--rss-growth-mib", type=float, default=d.rss_growth_mib,
                   help="most RSS growth allowed per process: from the start of the run to "
                        "its end for processes that survive it (the coordinator's), over "
                        "the second half of its life for a restarted service "
                        "(default: %(default)s)")
    p.add_argument("--timeout-s", type=float, default=d.timeout_s,
                   help="deadline of each request (default: %(default)s)")
    p.add_argument("--drain-s", type=float, default=d.drain_s,
                   help="after the last stream, how long sessions may take to reach 0 "
                        "(default: %(default)s)")
    p.add_argument("--no-pin", action="store_true",
                   help="do not pin the draft to the first CPU and the targets to the second")
    p.add_argument("--progress-s", type=float, default=d.progress_s,
                   help="seconds between progress lines (default: %(default)s)")
    p.add_argument("--out", metavar="FILE",
                   help="also write the figures as JSON to FILE (with every generation's "
                        "timeline)")
    p.add_argument("--log-dir", metavar="DIR",
                   help="write every service's and the coordinator's output to DIR")
    p.set_defaults(func=main)


def config_from(args: argparse.Namespace) -> SoakConfig:
    base = dict(SHORT) if args.short else {}
    for name in ("models", "streams", "duration_s"):
        if getattr(args, name) is not None:
            base[name] = getattr(args, name)
    if args.lengths:
        base["lengths"] = [int(x) for x in args.lengths.split(",") if x.strip()]
    elif base.get("models") == "tiny" and not args.short:
        base["lengths"] = FULL_TINY_LENGTHS
    return SoakConfig(**base, greedy_fraction=args.greedy_fraction,
                      cancel_fraction=args.cancel_fraction, stop_fraction=args.stop_fraction,
                      catalogue=args.catalogue, seed=args.seed,
                      fault_at=_floats(args.fault_at), faults=not args.no_faults,
                      max_concurrency=args.max_concurrency,
                      rss_growth_mib=args.rss_growth_mib, timeout_s=args.timeout_s,
                      drain_s=args.drain_s, pin=not args.no_pin, progress_s=args.progress_s,
                      log_dir=args.log_dir)


def main(args: argparse.Namespace) -> int:
    from specdec_tools.soak import report as soak_report
    cfg = config_from(args)
    if len(cfg.fault_at) != 3 or not all(0 < a < 1 for a in cfg.fault_at) \
            or list(cfg.fault_at) != sorted(cfg.fault_at):
        print("error: --fault-at takes three increasing fractions in (0, 1)", file=sys.stderr)
        return 2
    figures = soak(cfg, say=lambda m: print(m, file=sys.stderr, flush=True))
    print(soak_report.render(figures))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(figures, indent=2) + "\n")
        print(f"wrote {args.out}", file=sys.stderr)
    return 0 if figures["passed"] else 1


__all__ = ["SoakConfig", "add_parser", "asdict", "soak"]

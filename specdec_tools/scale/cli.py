"""`specdec bench-scale`: the scale-out runs of specdec_tools.scale, for real, on this machine.

Each run builds its own LAN of network namespaces, starts what it needs, puts load on it
and tears it down; its report goes into scale.json, and scale.md says the figures:
nodes and replicas per node over time, generations checked and the errors seen, the time
to scale up and down, the time to drain. Exit 1 when any generation failed or differed
from target-only output; 2 when network namespaces cannot be made here (not root).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

from specdec_tools.scale import pool_scenarios, ray_scenarios, sizing
from specdec_tools.scale.report import markdown

RUNS = {  # name -> (module, function)
    "multinode": (ray_scenarios, "multinode"),
    "autoscale": (ray_scenarios, "autoscale"),
    "pools": (pool_scenarios, "pools"),
    "rolling": (pool_scenarios, "rolling"),
    "sizing": (sizing, "sizing"),
}
NEEDS_NETNS = ("multinode", "autoscale", "pools", "rolling")


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from specdec_tools.netns.network import namespaces_permitted

    logging.basicConfig(level=logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    names = [n.strip() for n in args.runs.split(",") if n.strip()]
    ok, why = namespaces_permitted()
    if not ok and any(n in NEEDS_NETNS for n in names):
        print(f"error: {', '.join(n for n in names if n in NEEDS_NETNS)} need network "
              f"namespaces: {why}", file=sys.stderr)
        return 2
    unknown = [n for n in names if n not in RUNS]
    if unknown:
        print(f"error: unknown run(s) {', '.join(unknown)}; known: {', '.join(RUNS)}",
              file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    reports = {}
    bar = tqdm(names, desc="bench-scale", unit="run", file=sys.stderr)
    for name in bar:
        bar.set_postfix_str(name)
        module, function = RUNS[name]
        size = module.SHORT if args.short else module.FULL
        t0 = time.monotonic()
        report = getattr(module, function)(size)
        report["seconds"] = round(time.monotonic() - t0, 1)
        reports[name] = report
        tqdm.write(f"{name}: {report['generations']} generations, "
                   f"{len(report['errors'])} errors, "
                   f"{'exact' if report['exact'] else 'NOT EXACT'} ({report['seconds']} s)",
                   file=sys.stderr)
    meta = {"command": " ".join(["specdec", *sys.argv[1:]]), "date": time.strftime("%Y-%m-%d"),
            "form": "short" if args.short else "full"}
    (out / "scale.json").write_text(json.dumps({"meta": meta, "runs": reports}, indent=1))
    md = markdown(meta, reports)
    (out / "scale.md").write_text(md)
    print(md)
    print(f"wrote {out / 'scale.json'} and {out / 'scale.md'}", file=sys.stderr)
    failed = [n for n, r in reports.items() if r["errors"] or not r["exact"]]
    if failed:
        print(f"FAILURE: errors or changed output in: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser(
        "bench-scale", help="multi-node Ray cluster, autoscaling, pools, rolling replacement",
        description="Scale-out for real on this machine, each host a network namespace on "
                    "one LAN (needs root): a coordinator replica on each of two Ray nodes; "
                    "Serve autoscaling under 1 -> 16 -> 1 streams; draft and target pools "
                    "of different sizes behind DNS names, a replica removed, killed and "
                    "added; each target and draft replica replaced while 8 streams run; "
                    "and what one replica of each piece does (sizing: the real pair, no "
                    "namespaces). Every generation is checked against target-only output. "
                    "Writes scale.json and scale.md.")
    p.add_argument("--runs", default=",".join(NEEDS_NETNS),
                   help=f"comma-separated among {', '.join(RUNS)} (default: all but sizing)")
    p.add_argument("--short", action="store_true",
                   help="CI's short form: fewer prompts, shorter phases, 3 replicas at most "
                        "in the ramp (default: the full form)")
    p.add_argument("--out", default="bench-results/scale",
                   help="folder for scale.json and scale.md (default: %(default)s)")
    p.set_defaults(func=run)

"""python -m specdec_tools.scale.monitor ADDRESS [--interval S]: the coordinator's Serve
replicas over time, one JSON line per sample, until killed.

A Ray driver on the cluster at ADDRESS. Each sample says, at `time.monotonic()` (one
clock for every process on the machine, namespaces included):
  running   Serve's count of RUNNING replicas of the Coordinator deployment (ready to
            serve), and `states`, its count per replica state (STARTING, STOPPING, ...);
  nodes     the node IP of each live replica actor, counted ({"10.0.0.2": 1, ...}).
The actor table comes from Ray's GCS through `ray._private.state` (Ray's public state
API needs the dashboard, which these clusters leave out to spare the CPUs).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter

REPLICA_CLASS = "ServeReplica:specdec:Coordinator"


def sample() -> dict:
    from ray import serve
    from ray._private import state

    out = {"t": time.monotonic(), "running": 0, "states": {}, "nodes": {}}
    app = serve.status().applications.get("specdec")
    if app is not None and "Coordinator" in app.deployments:
        states = {str(getattr(k, "value", k)): v
                  for k, v in app.deployments["Coordinator"].replica_states.items()}
        out["states"], out["running"] = states, states.get("RUNNING", 0)
    nodes = Counter(a.get("Address", {}).get("IPAddress", "?")
                    for a in state.actors().values()
                    if a.get("ActorClassName") == REPLICA_CLASS and a.get("State") == "ALIVE")
    out["nodes"] = dict(nodes)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m specdec_tools.scale.monitor",
                                description="Sample the coordinator's Serve replicas per "
                                            "node; one JSON line per sample on stdout.")
    p.add_argument("address", help="the Ray cluster's GCS address (HOST:PORT)")
    p.add_argument("--interval", type=float, default=0.5, metavar="SECONDS",
                   help="seconds between samples (default: %(default)s)")
    args = p.parse_args(argv)
    import ray

    ray.init(address=args.address, log_to_driver=False, logging_level="WARNING")
    print(json.dumps({"ready": True}), flush=True)
    while True:
        try:
            line = sample()
        except Exception as exc:  # noqa: BLE001 - a sample missed is reported, not fatal
            line = {"t": time.monotonic(), "error": str(exc)}
        print(json.dumps(line), flush=True)
        time.sleep(args.interval)


if __name__ == "__main__":
    sys.exit(main())

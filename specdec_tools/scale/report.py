"""scale.json's runs as Markdown (pure: tested on synthetic reports)."""

from __future__ import annotations


def _s(x, unit=" s") -> str:
    return "-" if x is None else f"{x}{unit}"


def _checked(r: dict) -> str:
    return (f"{r['generations']} generations checked, {len(r['errors'])} errors, "
            f"{len(r['mismatches'])} outputs changed")


def multinode(r: dict) -> list[str]:
    out = [f"- Ray nodes: {', '.join(r['nodes'])}; coordinator replicas per node: "
           + ", ".join(f"{n}: {c}" for n, c in sorted(r["replicas_per_node"].items())),
           f"- {_checked(r)}; served on nodes {', '.join(r['nodes_serving'])}",
           "", "| client dialled proxy | replica's node | generations |", "|---|---|---|"]
    out += [f"| {x['proxy']} | {x['node']} | {x['generations']} |" for x in r["served"]]
    return out


def autoscale(r: dict) -> list[str]:
    out = [f"- Streams {' -> '.join(map(str, r['streams']))}, replicas "
           f"{r['min_replicas']}..{r['max_replicas']} (peak {r['peak_running']} running)",
           f"- Time to scale up: Serve starts a replica after "
           f"{_s(r.get('scale_up_decided_s'))}, it runs at {_s(r['scale_up_first_s'])}, "
           f"all {r['max_replicas']} at {_s(r['scale_up_full_s'])}; time to scale down to "
           f"{r['min_replicas']}: {_s(r['scale_down_s'])}; draining replicas took "
           + (", ".join(f"{d} s" for d in r["drain_s"]) or "-"),
           f"- {_checked(r)}",
           "", "| t (s from the ramp) | running | replicas per node | states |",
           "|---|---|---|---|"]
    out += [f"| {x['t']} | {x['running']} | "
            + ", ".join(f"{n}: {c}" for n, c in sorted(x["nodes"].items()))
            + " | " + ", ".join(f"{k} {v}" for k, v in sorted(x["states"].items())) + " |"
            for x in r["timeline"]]
    return out


def pools(r: dict) -> list[str]:
    out = [f"- {_checked(r)}", "",
           "| phase | generations | first draft | first target | re-pinned draft / target "
           "| errors |", "|---|---|---|---|---|---|"]
    for p in r["phases"]:
        share = ", ".join(f"{h} {n}" for h, n in sorted(p["by_draft"].items()))
        tshare = ", ".join(f"{h} {n}" for h, n in sorted(p["by_target"].items()))
        out.append(f"| {p['phase']} | {p['generations']} | {share} | {tshare} | "
                   f"{p['draft_repinned']} / {p['target_repinned']} | {len(p['errors'])} |")
    out += ["", "Per-replica load, as the HPAs read it (peak / mean over the run):", "",
            "| replica | gauge | peak | mean |", "|---|---|---|---|"]
    for host, gauges in sorted(r["metrics"].items()):
        out += [f"| {host} | {g} | {v['peak']:g} | {v['mean']:g} |"
                for g, v in sorted(gauges.items())]
    return out


def rolling(r: dict) -> list[str]:
    out = [f"- {_checked(r)}; generations re-pinned: {r['target_repinned']} to another "
           f"target, {r['draft_repinned']} to another draft", "",
           "| replaced | by | new replica ready | old one's drain (SIGTERM to exit) | step |",
           "|---|---|---|---|---|"]
    out += [f"| {x['role']} {x['old']} | {x['new']} | {x['new_ready_s']} s | "
            f"{x['drain_s']} s | {x['step_s']} s |" for x in r["replacements"]]
    return out


def sizing(r: dict) -> list[str]:
    out = [f"- {r['pair']}, {r['max_new_tokens']} new tokens a generation; "
           f"{_checked(r)}", "",
           "| mode | streams | tok/s | rounds/s | target verified tok/s | draft proposed "
           "tok/s | acceptance | target core busy | draft core busy | coordinator CPU "
           "ms/round | RPCs/round | bytes/round |", "|---" * 12 + "|"]
    for x in r["rows"]:
        acc = "-" if x["acceptance"] is None else f"{x['acceptance']:.2f}"
        out.append(f"| {x['mode']} | {x['streams']} | {x['tok_s']} | {x['rounds_s']} | "
                   f"{x['verified_tok_s']} | {x['drafted_tok_s']} | {acc} | "
                   f"{x['busy']['target']:.0%} | {x['busy']['draft']:.0%} | "
                   f"{x['coordinator_cpu_ms_per_round']} | {x['rpcs_per_round']} | "
                   f"{x['bytes_per_round']} |")
    return out


SECTIONS = {"multinode": ("Two Ray nodes", multinode),
            "autoscale": ("Serve autoscaling under a ramp", autoscale),
            "pools": ("Pools of different sizes", pools),
            "rolling": ("Rolling replacement under load", rolling),
            "sizing": ("One replica of each piece", sizing)}


def markdown(meta: dict, reports: dict) -> str:
    out = [f"- **Command:** `{meta['command']}` ({meta['date']}, {meta['form']} form)"]
    for name, r in reports.items():
        title, render = SECTIONS[name]
        out += ["", f"### {title} ({r.get('seconds', '?')} s)", ""] + render(r)
    return "\n".join(out) + "\n"

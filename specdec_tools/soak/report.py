"""The soak's verdict and figures: outputs checked, errors classified as designed or not,
sessions at the end, RSS per process, and the text and JSON that report them.

Designed errors (anything else fails the soak):
  UNAVAILABLE          "no target replica ..." while no target is left: from target B's
                       SIGTERM until it is back plus the recovery allowance
                       (FaultInjector.no_target_windows).
  RESOURCE_EXHAUSTED   the coordinator's concurrency limit, past its cap (--max-concurrency,
                       = the streams by default): the streams alone never exceed it, but a
                       stream cancelled on purpose keeps its slot until its round in flight
                       ends, so a request within CANCEL_HOLD_S of a deliberate cancellation
                       may find the cap full.
  CANCELLED            only as the deliberate cancellations themselves, which the client
                       makes and counts as "cancelled" (a CANCELLED status the client did
                       not ask for is undesigned).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict

from specdec.client import TokenKind
from specdec_tools.soak.load import matches, well_formed

CANCEL_HOLD_S = 10.0
DRAFTED = (TokenKind.ACCEPTED, TokenKind.RECOVERED, TokenKind.BONUS)


def classify(out, windows, cancel_times) -> str:
    """'designed' or 'undesigned' for a failed request."""
    t = out.ended_s
    if out.code == "UNAVAILABLE" and "no target replica" in out.message and \
            any(a <= t <= b for a, b in windows):
        return "designed"
    if out.code == "RESOURCE_EXHAUSTED" and "concurrency limit" in out.message and \
            any(t - CANCEL_HOLD_S <= c <= t for c in cancel_times):
        return "designed"
    return "undesigned"


def _pool_growth(pool: list[tuple[float, float]], t0: float, t1: float) -> float:
    """How much a service's KV block pool grew between the snapshots at t0 and t1 (MiB;
    0 without pool figures)."""
    at = dict(pool)
    if t0 not in at or t1 not in at:
        return 0.0
    return round(at[t1] - at[t0], 1)


def _rss(rss, bound: float) -> tuple[dict, list[str]]:
    """Per process: first and last RSS, and the growth checked against `bound` (from
    'warm' for a process that lived through the run; over the second half of its life for
    one restarted during it), less what its KV block pool grew meanwhile (a paged pool
    doubles when the sessions need more blocks and is kept, by design: it is bounded by
    --max-cached-tokens, not a leak); the list of processes over the bound."""
    table, over = {}, []
    for (label, pid), series in sorted(rss.series.items(), key=lambda kv: kv[1][0][1]):
        first, last = series[0], series[-1]
        row = {"pid": pid, "start": {"at": first[0], "mib": first[2]},
               "end": {"at": last[0], "mib": last[2]}, "checked": None}
        if last[0] == "end":
            whens = [w for w, _, _ in series]
            if "warm" in whens:
                base = series[whens.index("warm")]
            else:  # restarted during the run: its second half
                mid = (first[1] + last[1]) / 2
                base = min(series, key=lambda s: abs(s[1] - mid))
            growth = round(last[2] - base[2], 1)
            pool = _pool_growth(rss.pool.get((label, pid), []), base[1], last[1])
            growth = round(growth - pool, 1)  # the KV pool's growth is kept by design
            row["checked"] = {"from": base[0], "growth_mib": growth, "bound_mib": bound,
                              "kv_pool_growth_mib": pool, "ok": growth < bound}
            if growth >= bound:
                over.append(f"{label} (pid {pid}) grew {growth:.1f} MiB from {base[0]}")
        table[f"{label} [{pid}]"] = row
    return table, over


def figures(cfg, cap, outcomes, mix, faults, rss, sessions, ended_s, drained,
            coordinator_errors=()) -> dict:
    windows = faults.no_target_windows()
    cancels = [o.ended_s for o in outcomes if o.status == "cancelled"]
    status = Counter(o.status for o in outcomes)
    failed = Counter(o.code for o in outcomes if o.status == "failed")
    designed, undesigned, examples = Counter(), Counter(), []
    for o in outcomes:
        if o.status != "failed":
            continue
        if classify(o, windows, cancels) == "designed":
            designed[o.code] += 1
        else:
            undesigned[o.code] += 1
            examples.append(f"t={o.ended_s:.1f}s stream {o.stream}: {o.code}: {o.message}")
    exact, mismatches, malformed = 0, [], []
    completed = [o for o in outcomes if o.status == "completed"]
    for o in completed:
        problem = well_formed(o)
        if problem:
            malformed.append(f"t={o.ended_s:.1f}s {o.spec.kind} {o.spec}: {problem}")
        if o.spec.kind == "greedy":
            diff = matches(o, mix.references[o.spec.key])
            if diff:
                mismatches.append(f"t={o.ended_s:.1f}s stream {o.stream} K={o.spec.k} "
                                  f"{o.spec.key}: {diff}")
            else:
                exact += 1
    greedy = sum(o.spec.kind == "greedy" for o in completed)
    draft_back = next((f.back_s for f in faults.faults if f.name == "draft-kill"), None)
    recovered_at = max((f.back_s or f.at_s or 0.0) for f in faults.faults) \
        if cfg.faults else 0.0
    after = [o for o in completed if o.started_s >= recovered_at]
    drafted_after = [o for o in completed if draft_back is not None and
                     o.started_s >= draft_back and any(k in DRAFTED for k in o.kinds)]
    rss_table, rss_over = _rss(rss, cfg.rss_growth_mib)
    leaks = {name: n for name, n in sessions.items() if n}
    checks = [
        ("every completed greedy output equals its target-only reference",
         not mismatches and greedy > 0, f"{exact} of {greedy} exact"),
        ("every completed output is well-formed", not malformed,
         f"{len(completed) - len(malformed)} of {len(completed)}"),
        ("no error but designed ones", not undesigned,
         f"designed {dict(designed) or 0}, undesigned {dict(undesigned) or 0}"),
        ("the coordinator logged no internal error", not coordinator_errors,
         f"{len(coordinator_errors)} ERROR lines in its replica's log"
         + (f", e.g. {Counter(coordinator_errors).most_common(1)[0][0]}"
            if coordinator_errors else "")),
        ("every service holds 0 sessions at the end", not leaks and drained,
         ", ".join(f"{k} {'dead' if v is None else v}" for k, v in sessions.items())
         + ("" if drained else "; some streams never finished")),
        (f"RSS growth < {cfg.rss_growth_mib:.0f} MiB per process", not rss_over,
         "; ".join(rss_over) or "all within"),
    ]
    if cfg.faults:
        checks += [
            ("every fault injected, restarts back", not faults.errors and all(
                f.at_s is not None and (f.back_s is not None or f.name == "target-kill")
                for f in faults.faults), "; ".join(faults.errors) or "all three"),
            ("generations complete after the last recovery", len(after) > 0,
             f"{len(after)} completed after {recovered_at:.1f} s"),
            ("the draft speculates again after its restart", len(drafted_after) > 0,
             f"{len(drafted_after)} completed generations with drafted tokens after "
             f"{draft_back or 0:.1f} s"),
        ]
    tokens = sum(len(o.token_ids) for o in outcomes)
    config = asdict(cfg)
    config["max_concurrency"] = cap
    return {
        "config": config,
        "streams": cfg.streams, "duration_s": cfg.duration_s, "ended_s": round(ended_s, 1),
        "generations": {"total": len(outcomes), "completed": status["completed"],
                        "cancelled": status["cancelled"], "failed": dict(failed),
                        "greedy_completed": greedy,
                        "sampled_completed": len(completed) - greedy},
        "tokens": tokens, "tokens_per_s": round(tokens / max(ended_s, 1e-9), 1),
        "faults": [f.as_dict() for f in faults.faults] if cfg.faults else [],
        "unavailable_designed_windows_s": [[round(a, 1), round(b, 1)] for a, b in windows],
        "outputs_checked": {"greedy_exact": exact, "greedy_mismatch": len(mismatches),
                            "well_formed": len(completed) - len(malformed),
                            "malformed": len(malformed), "references": len(mix.references)},
        "mismatches": mismatches[:20], "malformed": malformed[:20],
        "errors": {"designed": dict(designed), "undesigned": dict(undesigned)},
        "undesigned_examples": examples[:20],
        "coordinator_errors": dict(Counter(coordinator_errors).most_common(10)),
        "sessions_at_end": sessions,
        "rss_mib": rss_table,
        "timeline": [[round(o.started_s, 2), round(o.ended_s, 2), o.stream, o.spec.kind,
                      o.spec.k, o.spec.max_new_tokens, o.status, o.code, len(o.token_ids),
                      sum(k in DRAFTED for k in o.kinds)] for o in outcomes],
        "checks": [{"check": c, "passed": bool(ok), "detail": d} for c, ok, d in checks],
        "passed": all(ok for _, ok, _ in checks),
    }


def render(f: dict) -> str:
    g = f["generations"]
    failed = ", ".join(f"{c} {n}" for c, n in sorted(g["failed"].items())) or "none"
    lines = [
        "== specdec soak",
        f"models: {f['config']['models']}; streams: {f['streams']}; duration: "
        f"{f['duration_s']:.0f} s (last stream done at {f['ended_s']:.1f} s); coordinator "
        f"cap {f['config']['max_concurrency']}",
        f"generations: {g['total']} ({g['completed']} completed: {g['greedy_completed']} "
        f"greedy, {g['sampled_completed']} sampled; {g['cancelled']} cancelled on purpose; "
        f"failed: {failed}); {f['tokens']} tokens, {f['tokens_per_s']} tok/s",
        "faults:",
    ]
    for x in f["faults"]:
        back = f", back at {x['back_s']:.1f} s" if x["back_s"] is not None else ", left dead"
        at = f"{x['at_s']:.1f} s" if x["at_s"] is not None else "not injected"
        lines.append(f"  {x['name']:<15s} {x['service']:<9s} at {at}{back} ({x['detail']})")
    if not f["faults"]:
        lines.append("  none (--no-faults)")
    w = f["unavailable_designed_windows_s"]
    lines.append("UNAVAILABLE designed during: "
                 + (", ".join(f"{a:.1f}-{b:.1f} s" for a, b in w) or "never"))
    o = f["outputs_checked"]
    lines.append(f"outputs checked: {o['greedy_exact']} greedy exact, {o['greedy_mismatch']} "
                 f"greedy mismatches (against {o['references']} references); "
                 f"{o['well_formed']} well-formed, {o['malformed']} malformed")
    for m in f["mismatches"] + f["malformed"]:
        lines.append(f"  ! {m}")
    e = f["errors"]
    lines.append(f"errors by code: designed {_counts(e['designed'])}; undesigned "
                 f"{_counts(e['undesigned'])}")
    for x in f["undesigned_examples"]:
        lines.append(f"  ! {x}")
    lines.append("sessions at the end: " + ", ".join(
        f"{k} {'(dead)' if v is None else v}" for k, v in f["sessions_at_end"].items()))
    lines.append("RSS (MiB), start -> end:")
    for label, r in f["rss_mib"].items():
        c = r["checked"]
        pool = f", KV pool +{c['kv_pool_growth_mib']:.1f} not counted" \
            if c and c.get("kv_pool_growth_mib") else ""
        check = f"  growth {c['growth_mib']:+.1f} from {c['from']}{pool} " \
                f"({'ok' if c['ok'] else 'OVER'} < {c['bound_mib']:.0f})" if c else ""
        lines.append(f"  {label:<52s} {r['start']['mib']:7.1f} ({r['start']['at']}) -> "
                     f"{r['end']['mib']:7.1f} ({r['end']['at']}){check}")
    lines.append("checks:")
    for c in f["checks"]:
        lines.append(f"  [{'PASS' if c['passed'] else 'FAIL'}] {c['check']}: {c['detail']}")
    lines.append("SOAK PASSED" if f["passed"] else "SOAK FAILED")
    return "\n".join(lines)


def _counts(c: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(c.items())) or "none"

"""``python -m bench.report``: docs/benchmarks.md's results table from bench/results/latest.json.
``python -m bench.report cost``: docs/cost.md's tables (each scenario against its target, units
and dollars per fire, the idle month) from the same results."""

from __future__ import annotations

import json
import sys
from typing import Any

from bench.common import RESULTS

BEFORE = RESULTS.with_name("before.json")


def _ms(value: Any) -> str:
    return "-" if value is None else f"{value:,.0f} ms"


def _lags(s: dict[str, Any]) -> str:
    return " / ".join(_ms(s.get(k)) for k in ("p50", "p90", "p99", "max"))


def _faults(s: dict[str, Any]) -> str:
    missing = "? (not drained)" if s.get("missing", 0) is None else s.get("missing", 0)
    return f"{s.get('early', 0)} early, {s.get('duplicates', 0)} dup, {missing} missing"


def rows(now: dict[str, Any], before: dict[str, Any]) -> list[tuple[str, str, str]]:
    out: list[tuple[str, str, str]] = []
    old_e2e = before.get("e2e", {})
    old_steady: dict[str, Any] = next(
        (s for s in old_e2e.get("steady_levels", []) if s["timers"] == 20), {}
    )
    old_bursts = {b["n"]: b for b in old_e2e.get("bursts", [])}
    if e := now.get("e2e"):
        s = e["steady"]
        old_lags = {k: old_steady.get(f"{k}_ms") for k in ("p50", "p90", "p99", "max")}
        out += [
            ("steady 20 timers every 1 s: fired_at lag p50 / p90 / p99 / max",
             _lags(s["fired_at_lag_ms"]), _lags(old_lags) if old_steady else "-"),
            ("... SQS SentTimestamp lag p50 / p90 / p99 / max", _lags(s["sent_lag_ms"]), "-"),
            ("... receive-time lag p50 / p90 / p99 / max", _lags(s["receive_lag_ms"]), "-"),
            ("... early, duplicates, missing", _faults(s),
             _faults(old_steady) if old_steady else "-"),
            ("... trigger invocations per fire", f"{s['invocations_per_fire']}", "-"),
            ("spaced one-shots: max fired_at lag", _ms(e["spaced"]["fired_at_lag_ms"]["max"]),
             "600-1,000 ms (issue 10)"),
            ("tenant B's lone timer during A's 300-burst: lag", _ms(e["fairness"]["b_lag_ms"]),
             "9,600 ms (issue 10)"),
        ]  # fmt: skip
        if cold := e.get("cold"):
            out.append((f"first fires after idle ({cold['fires']} in {len(cold['rounds'])} "
                        "rounds, cold sandboxes): SQS SentTimestamp lag p50 / max",
                        f"{_ms(cold['sent_lag_ms']['p50'])} / {_ms(cold['sent_lag_ms']['max'])}"
                        f", {_faults(cold)}", "1,600-2,700 ms (issue 18)"))  # fmt: skip
        for key in sorted(k for k in e if k.startswith("burst_") and isinstance(e[k], dict)):
            b, old = e[key], old_bursts.get(e[key]["n"], {})
            out.append((
                f"{b['n']:,} one-shots due in one second: drained in (moto share of CPU)",
                (f"{b['drain_s']} s" if b["drained"] else f"not in {b['drain_s']} s: "
                 f"{b['arrived']:,} arrived, ~{b['projected_drain_s']:,} s projected")
                + f" ({b['moto_share_of_stack_cpu']}), {_faults(b)}",
                f"{old['drain_s']} s, {_faults(old)}" if old else "-",
            ))  # fmt: skip
    if c := now.get("cost"):
        old = before.get("cost", {}).get("usd_per_million_fires", {})
        per, wru = c["usd_per_million_fires"], c["wru_per_fire"]
        old_for = {"recurring_batched": old.get("recurring_burst"),
                   "recurring_alone": old.get("recurring"), "one_shot": old.get("one_shot"),
                   "one_shot_batch_create": old.get("one_shot_burst")}  # fmt: skip
        for name, usd in per.items():
            was = old_for.get(name)
            before_usd = "-" if was is None else f"${was:.2f}"
            out.append((f"$ per million fires: {name} (WRU per fire)",
                        f"${usd:.3f} ({wru[name]:.2f})", before_usd))  # fmt: skip
        was_idle = before.get("cost", {}).get("usd_per_idle_month")
        out.append(("$ per idle month", f"${c['usd_per_idle_month']:.2f}",
                    "-" if was_idle is None else f"${was_idle:.2f}"))  # fmt: skip
    if g := now.get("engine"):
        rates = f"{g['fires_per_s']:,} vs {g['baseline_fires_per_s']:,} ({g['ratio']}x)"
        out.append(("Redis lease -> finish vs one zset + one lock, fires/s (4 workers)", rates,
                    "-"))  # fmt: skip
        if "ratio_at_rtt" in g:
            far = g["runs"]["engine_4w_rtt"]["fires_per_s"], g["runs"]["baseline_4w_rtt"]
            out.append(
                (
                    f"... the same at {g['rtt_ms']} ms round trips (ElastiCache in-AZ)",
                    f"{far[0]:,} vs {far[1]['fires_per_s']:,} ({g['ratio_at_rtt']}x)",
                    "-",
                )
            )
        for shape, p in g.get("per_fire", {}).items():
            out.append(
                (
                    f"Redis per fire, {shape}: commands / us of redis-server CPU",
                    f"{p['redis_commands_per_fire']} / {p['redis_cpu_us_per_fire']} us",
                    "17.7 / 44 us (issue 18)" if shape == "recurring" else "-",
                )
            )
        if h := g.get("hot_second"):
            out.append((f"hot second: {h['timers']:,} one-shots of one tenant due together, "
                        "real trigger on moto", f"drained in {h['drain_seconds']} s of work, "
                        f"{h['missing']} missing, {h['duplicated']} dup, {h['left_in_redis']} "
                        f"stuck; {h['claim_items']:,} claim items of <= {h['claim_cap']} entries",
                        "-"))  # fmt: skip
    if f := now.get("flush"):
        out.append(("FLUSHALL after the migrator read later work, rounds of 250 + 15",
                    f"{len(f['rounds'])} rounds: {f['lost']} lost, {f['duplicates']} dup, "
                    f"{f['early']} early", "-"))  # fmt: skip
    return out


def table(now: dict[str, Any], before: dict[str, Any] | None = None) -> str:
    """docs/benchmarks.md's table: what was measured and the result (``before``, the previous fire
    path's results, is still read by :func:`rows`, not shown)."""
    lines = ["| measured | result |", "|---|---|"]
    lines += [f"| {a} | {b} |" for a, b, _ in rows(now, before or {})]
    m = now.get("machine", {})
    lines.append(f"\nMachine: {m.get('cpu')}, {m.get('cores')} cores, {m.get('ram_gib')} GiB, "
                 f"Python {m.get('python')}, redis-server {m.get('redis_server')}.")  # fmt: skip
    return "\n".join(lines)


def _grid(head: str, rows: dict[str, list[str]], names: list[str]) -> str:
    lines = [f"| {head} | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    return "\n".join([*lines, *(f"| {k} | " + " | ".join(v) + " |" for k, v in rows.items())])


def targets_table(cost: dict[str, Any]) -> str:
    """Each scenario against its target (issue 17): met or missed, and by how much."""
    targets = cost.get("targets_usd_per_million", {})
    lines = ["| scenario | $ per million fires | target | |", "|---|---:|---:|---|"]
    figures = dict(cost["usd_per_million_fires"])
    figures["idle_month"] = cost["usd_per_idle_month"]
    for name, usd in figures.items():
        target = targets.get(name)
        unit = "/month" if name == "idle_month" else ""
        shown = f"${usd:.2f}/month" if unit else f"${usd:.3f}"
        if target is None:
            lines.append(f"| {name} | {shown} | - | no target |")
            continue
        gap = usd - target
        if gap > 0:
            verdict = f"**missed** by ${gap:.2f} ({gap / target:.0%})"
        else:  # under by less than half a cent reads "met", not "$-0.00 under"
            verdict = "met" if gap > -0.005 else f"met, ${-gap:.2f} under"
        lines.append(f"| {name} | {shown} | ≤ ${target:.2f}{unit} | {verdict} |")
    return "\n".join(lines)


def cost_tables(cost: dict[str, Any]) -> str:
    scenarios = cost["scenarios"]
    names = [n for n in scenarios if n in cost["usd_per_million_fires"]]  # per fire, not per op
    units = {k: [f"{scenarios[n]['units_per_fire'].get(k, 0):.3g}" for n in names]
             for k in scenarios[names[0]]["units_per_fire"] if k != "wru"}  # fmt: skip
    units["fires per trigger run"] = [f"{scenarios[n]['fires_per_trigger_run']}" for n in names]
    usd = {k: [f"{scenarios[n]['usd_per_million_fires_by_item'].get(k, 0):.3f}" for n in names]
           for k in scenarios[names[0]]["usd_per_million_fires_by_item"]}  # fmt: skip
    usd["**total**"] = [f"**{scenarios[n]['usd_per_million_fires']:.3f}**" for n in names]
    idle = {k: [f"{v:.2f}"] for k, v in cost["usd_per_idle_month_by_item"].items()}
    idle["**total**"] = [f"**{cost['usd_per_idle_month']:.2f}**"]
    tables = [targets_table(cost), _grid("per fire", units, names),
              _grid("$ per million fires", usd, names)]  # fmt: skip
    if ops := list(cost.get("usd_per_million_ops", {})):
        per_op = {k: [f"{scenarios[n]['units_per_fire'].get(k, 0):.3g}" for n in ops]
                  for k in ("wru", "rru", "lambda_api_invocations", "lambda_trigger_runs",
                            "sqs_requests", "redis_commands")}  # fmt: skip
        per_op["**$ per million**"] = [f"**{cost['usd_per_million_ops'][n]:.3f}**" for n in ops]
        tables.append(_grid("per operation", per_op, ops))
    return "\n\n".join([*tables, _grid("idle item", idle, ["$/month"])])


def main() -> int:
    try:
        now = json.loads(RESULTS.read_text())
    except (OSError, ValueError):
        print(f"no results yet in {RESULTS}: run `make bench`", file=sys.stderr)
        return 1
    if sys.argv[1:] == ["cost"]:
        print(cost_tables(now["cost"]))
        return 0
    before = json.loads(BEFORE.read_text()) if BEFORE.exists() else {}
    print(table(now, before))
    print(f"\n(from {RESULTS}; rerun: make bench, or make bench QUICK=1)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

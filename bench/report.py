"""``python -m bench.report``: the results table (the README's) from bench/results/latest.json."""

from __future__ import annotations

import json
import sys
from typing import Any

from bench.common import RESULTS


def _ms(value: Any) -> str:
    return "-" if value is None else f"{value:,.0f} ms"


def table(results: dict[str, Any]) -> str:
    rows: list[tuple[str, str]] = []
    engine = results.get("engine")
    if engine:
        rows += [
            ("engine: Redis lease -> ack, fires/s", f"{engine['fires_per_s']:,}"),
            ("naive baseline (one zset, one lock), fires/s", f"{engine['baseline_fires_per_s']:,}"),
            ("engine / baseline", f"{engine['ratio']}x"),
        ]
    e2e = results.get("e2e")
    if e2e:
        for steady in e2e.get("steady_levels") or [e2e["steady"]]:
            rows.append(
                (
                    f"local stack, {steady['timers']} timers every 1 s (delivered"
                    f" {steady['fires_per_s']:.0f} fires/s): lag p50 / p99 / max",
                    f"{_ms(steady['p50_ms'])} / {_ms(steady['p99_ms'])} / {_ms(steady['max_ms'])}"
                    f" ({steady['early']} early)",
                )
            )
        for burst in e2e["bursts"]:
            rows.append(
                (
                    f"local stack, {burst['n']:,} due in one second: lag p50 / p99, drained in",
                    f"{_ms(burst['p50_ms'])} / {_ms(burst['p99_ms'])}, {burst['drain_s']} s"
                    f" ({burst['early']} early, {burst.get('missing', 0)} missing,"
                    f" {burst.get('duplicates', 0)} duplicates)",
                )
            )
    cost = results.get("cost")
    if cost:
        per = cost["usd_per_million_fires"]
        rows += [
            ("$ per million one-shot fires (incl. the create)", f"${per['one_shot']:.2f}"),
            ("$ per million recurring fires", f"${per['recurring']:.2f}"),
            ("$ per idle month", f"${cost['usd_per_idle_month']:.2f}"),
            ("EventBridge Scheduler / Cloud Tasks, $ per million", "$1.00 / $0.40"),
        ]
    lines = ["| measured | result |", "|---|---|"] + [f"| {k} | {v} |" for k, v in rows]
    m = results.get("machine", {})
    lines.append("")
    lines.append(
        f"Machine: {m.get('cpu')}, {m.get('cores')} cores, {m.get('ram_gib')} GiB, "
        f"Python {m.get('python')}, redis-server {m.get('redis_server')}."
    )
    return "\n".join(lines)


def main() -> int:
    try:
        results = json.loads(RESULTS.read_text())
    except (OSError, ValueError):
        print(f"no results yet in {RESULTS}: run `make bench`", file=sys.stderr)
        return 1
    print(table(results))
    print(f"\n(from {RESULTS}; rerun: make bench, or make bench QUICK=1)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``python -m bench.bill_table``: docs/cost.md's "your bill at N fires a month" from
bench/results/latest.json, beside EventBridge Scheduler and QStash at their list prices.

The service's column is its idle month (``cost.usd_per_idle_month``) plus the month's fires
priced by the cost curve (the ``spread_*`` scenarios: one tenant's fires spread evenly at 0.1,
1, 10 and 100 a second, on the dot and with a 60 s window) at the load the month makes - what
a fire costs depends on how many share its trigger run and claim writes. A month of N fires is
taken as one tenant's steady N / 730 h; tenants that split the load each pay the curve at their
own share (fewer fires batch together), so the table is a floor for many small tenants. The
others are priced per fire from their published prices (below; check them before quoting).
Free tiers are left out of every column.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import RESULTS
from bench.cost_scenarios import SPREAD_RATES, SPREAD_WINDOWS_S, spread_name

ROOT = Path(__file__).resolve().parents[1]

VOLUMES = (10_000, 1_000_000, 100_000_000)  # fires a month
DAYS = 30  # a month, for "a day"

EVENTBRIDGE_SCHEDULER_PER_M = 1.00  # scheduled invocations, per million (us-east-1)
SQS_SEND_PER_M = 0.40  # the SendMessage each invocation of an SQS target makes, per million
QSTASH_PER_M = 10.00  # QStash pay as you go: $1 per 100K messages (upstash.com/pricing/qstash)


SECONDS_A_MONTH = 730 * 3600  # AWS bills a month as 730 hours


@dataclass(frozen=True)
class Curve:
    """The cost benchmark's curve for one window: $ per million fires of one tenant at each
    load (fires a second), measured at 0.1, 1, 10 and 100."""

    window_s: int
    points: tuple[tuple[float, float], ...]  # (fires a second, $ per million), rising load

    @classmethod
    def of(cls, cost: dict[str, Any], window_s: int) -> Curve:
        per_m = cost["usd_per_million_fires"]
        return cls(window_s, tuple(
            (rate, float(per_m[spread_name(name, window_s)]))
            for name, rate in SPREAD_RATES.items()
            if spread_name(name, window_s) in per_m  # a load not measured: left out
        ))  # fmt: skip

    def usd_per_million(self, fires_per_second: float) -> float:
        """Between two measured loads: linear in log(load). Below the lightest, each fire is
        alone anyway (its figure); above the heaviest, its figure (batching only gets better)."""
        (lo_rate, lo_usd), *rest = self.points
        if fires_per_second <= lo_rate:
            return lo_usd
        for hi_rate, hi_usd in rest:
            if fires_per_second <= hi_rate:
                t = math.log(fires_per_second / lo_rate) / math.log(hi_rate / lo_rate)
                return lo_usd + t * (hi_usd - lo_usd)
            lo_rate, lo_usd = hi_rate, hi_usd
        return lo_usd


def eventbridge_per_m() -> float:
    """Scheduler's invocation and the SQS send it makes."""
    return EVENTBRIDGE_SCHEDULER_PER_M + SQS_SEND_PER_M


def _usd(value: float) -> str:
    if value >= 1_000:
        return f"${value:,.0f}"
    return f"${value:,.2f}"


def month(cost: dict[str, Any], curve: Curve, fires: float) -> float:
    """This service's month: the idle month plus the fires at the curve's price for their load
    (a month's fires, as one tenant's steady rate)."""
    rate = fires / SECONDS_A_MONTH
    return float(cost["usd_per_idle_month"]) + fires / 1e6 * curve.usd_per_million(rate)


def crossover(cost: dict[str, Any], curve: Curve) -> float | None:
    """The fewest fires a month from which this service costs less than EventBridge
    Scheduler; None if its price per fire never gets below Scheduler's (above the heaviest
    measured load the curve keeps that load's price: an upper bound)."""
    if curve.points[-1][1] >= eventbridge_per_m():
        return None
    fires = 1e4
    while month(cost, curve, fires) >= fires / 1e6 * eventbridge_per_m():
        fires *= 1.02
    return fires


def rows(cost: dict[str, Any]) -> list[list[str]]:
    out = []
    for window_s in SPREAD_WINDOWS_S:
        curve = Curve.of(cost, window_s)
        for fires in VOLUMES:
            rate = fires / SECONDS_A_MONTH
            out.append([
                "on the dot" if window_s == 0 else f"{window_s} s window",
                f"{fires:,}",
                f"one tenant at {rate:.3g} fires/s",
                _usd(month(cost, curve, fires)),
                _usd(fires / 1e6 * eventbridge_per_m()),
                _usd(fires / 1e6 * QSTASH_PER_M),
            ])  # fmt: skip
    return out


def table(cost: dict[str, Any]) -> str:
    head = ["precision", "fires a month", "load it assumes", "this service",
            "EventBridge Scheduler", "QStash (pay as you go)"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|---|---:|---:|---:|---:|---:|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows(cost)]
    return "\n".join(lines)


def crossovers(cost: dict[str, Any]) -> str:
    """One sentence per window: from which load this service is the cheaper."""
    said = []
    for window_s in SPREAD_WINDOWS_S:
        at = crossover(cost, Curve.of(cost, window_s))
        what = "on the dot" if window_s == 0 else f"with a {window_s} s window"
        said.append(
            f"{what}: from {at / 1e6:.1f} million fires a month ({at / SECONDS_A_MONTH:.1f} "
            "fires/s)"
            if at is not None
            else f"{what}: never (its price per fire stays above Scheduler's)"
        )
        # (the idle month is what a light load pays for; the fires' own price decides above)
    return "Cheaper than EventBridge Scheduler " + "; ".join(said) + "."


def main(argv: list[str] | None = None) -> int:
    path = Path((argv or sys.argv[1:] or [str(RESULTS)])[0])
    try:
        cost = json.loads(path.read_text())["cost"]
    except (OSError, ValueError, KeyError):
        print(f"no cost results in {path}: run `make bench` (or python -m bench.cost)",
              file=sys.stderr)  # fmt: skip
        return 1
    print(table(cost))
    print("\n" + crossovers(cost))
    shown = path.resolve().relative_to(ROOT) if path.resolve().is_relative_to(ROOT) else path
    print(
        f"\n(this service: the idle month ${cost['usd_per_idle_month']:.2f} plus the fires at "
        f"the cost curve's $ per million for their load, from {shown}; prices as of "
        f"{cost.get('prices_as_of', '?')})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

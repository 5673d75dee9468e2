"""docs/cost.md's bill table (bench/bill_table.py): the arithmetic, on made-up figures."""

from __future__ import annotations

import pytest

from bench import bill_table
from bench.cost_scenarios import SPREAD_RATES, SPREAD_WINDOWS_S, spread_name

CURVE = {"0p1": 4.0, "1": 3.0, "10": 2.0, "100": 1.0}
COST = {
    "usd_per_idle_month": 30.0,
    "usd_per_million_fires": {spread_name(r, w): usd / (1 + w / 10)
                              for r, usd in CURVE.items() for w in SPREAD_WINDOWS_S},
}  # fmt: skip


def test_a_load_between_two_measured_ones_is_priced_on_the_log_scale() -> None:
    curve = bill_table.Curve.of(COST, 0)
    assert [r for r, _ in curve.points] == list(SPREAD_RATES.values())
    assert curve.usd_per_million(0.001) == 4.0  # below the lightest: each fire alone anyway
    assert curve.usd_per_million(1) == 3.0
    assert curve.usd_per_million(10**0.5) == pytest.approx(2.5)  # halfway between 1 and 10
    assert curve.usd_per_million(1_000) == 1.0  # above the heaviest: its figure


def test_the_service_pays_its_idle_month_plus_its_fires_at_their_load() -> None:
    rows = {(r[0], r[1]): r for r in bill_table.rows(COST)}
    million = rows[("on the dot", "1,000,000")]
    rate = 1e6 / bill_table.SECONDS_A_MONTH  # 0.38 fires/s: between 0.1 and 1
    ours = 30.0 + bill_table.Curve.of(COST, 0).usd_per_million(rate)
    assert million[2:] == [f"one tenant at {rate:.3g} fires/s", f"${ours:,.2f}", "$1.40", "$10.00"]
    assert len(rows) == len(SPREAD_WINDOWS_S) * len(bill_table.VOLUMES)
    assert ("60 s window", "100,000,000") in rows


def test_the_crossover_is_the_first_month_cheaper_than_eventbridge_scheduler() -> None:
    curve = bill_table.Curve.of(COST, 60)  # $0.57 a million at 100 fires/s
    at = bill_table.crossover(COST, curve)
    assert at is not None
    assert bill_table.month(COST, curve, at) < at / 1e6 * 1.40
    assert bill_table.month(COST, curve, at / 1.05) >= at / 1.05 / 1e6 * 1.40
    dear = {**COST, "usd_per_million_fires": dict.fromkeys(COST["usd_per_million_fires"], 2.0)}
    assert bill_table.crossover(dear, bill_table.Curve.of(dear, 0)) is None  # never below $1.40
    assert "on the dot: never" in bill_table.crossovers(dear)

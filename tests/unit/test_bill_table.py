"""docs/cost.md's bill table (bench/bill_table.py): the arithmetic, on made-up figures."""

from __future__ import annotations

from pathlib import Path

from bench import bill_table

COST = {
    "usd_per_idle_month": 30.0,
    "usd_per_million_fires": {s.scenario: 2.0 for s in bill_table.SHAPES},
}


def test_the_service_pays_its_idle_month_plus_its_fires_and_the_others_per_fire() -> None:
    rows = {(r[0], r[1]): r for r in bill_table.rows(COST)}
    hourly = rows[("hourly cron, timers due together", "1,000,000")]
    assert hourly[2:] == ["1,389 timers", "$32.00", "$1.40", "$10.00"]
    webhooks = rows[("webhooks, due together", "100,000,000")]
    assert webhooks[2:] == ["3,333,333 fires a day", "$230.00", "$120.00", "$1,000"]
    assert len(rows) == len(bill_table.SHAPES) * len(bill_table.VOLUMES)


def test_every_shape_stands_for_a_scenario_the_cost_benchmark_runs() -> None:
    from bench import cost_scenarios

    source = Path(cost_scenarios.__file__).read_text()
    assert all(f'"{s.scenario}"' in source for s in bill_table.SHAPES)

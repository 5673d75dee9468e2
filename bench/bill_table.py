"""``python -m bench.bill_table``: docs/cost.md's "your bill at N timers a day" from
bench/results/latest.json, beside EventBridge Scheduler and QStash at their list prices.

The service's column is its idle month (``cost.usd_per_idle_month``) plus the month's fires at
the measured dollars per fire of the scenario that stands for each shape
(``cost.usd_per_million_fires``). The others are priced per fire from their published prices
(below; check them before quoting). Free tiers are left out of every column.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import RESULTS

ROOT = Path(__file__).resolve().parents[1]

VOLUMES = (10_000, 1_000_000, 100_000_000)  # fires a month
DAYS = 30  # a month, for "a day"

EVENTBRIDGE_SCHEDULER_PER_M = 1.00  # scheduled invocations, per million (us-east-1)
SQS_SEND_PER_M = 0.40  # the SendMessage each invocation of an SQS target makes, per million
API_DESTINATION_PER_M = 0.20  # EventBridge API destinations, per million (an HTTP target)
QSTASH_PER_M = 10.00  # QStash pay as you go: $1 per 100K messages (upstash.com/pricing/qstash)


@dataclass(frozen=True)
class Shape:
    name: str
    scenario: str  # the cost benchmark's scenario standing for it
    unit: str  # what a month of fires is: "timers" (recurring) or "... a day"
    fires_per_timer: int  # a month's fires of one recurring timer; 0: counted per day
    webhook: bool = False

    def that_is(self, fires: int) -> str:
        count = fires / self.fires_per_timer if self.fires_per_timer else fires / DAYS
        return f"{round(count):,} {self.unit}"


SHAPES = (
    Shape("hourly cron, timers due together", "cron_hourly_batched", "timers", 24 * DAYS),
    Shape("daily cron, each fire alone", "cron_daily_alone", "timers", DAYS),
    Shape(
        "one-shots made a day ahead, one create request each",
        "one_shot_ahead",
        "one-shots a day",
        0,
    ),
    Shape(
        "one-shots made a day ahead, 100 per batch request",
        "one_shot_ahead_batch",
        "one-shots a day",
        0,
    ),
    Shape("webhooks, due together", "webhook_batched", "fires a day", 0, webhook=True),
)


def _usd(value: float) -> str:
    if value >= 1_000:
        return f"${value:,.0f}"
    return f"${value:,.2f}"


def eventbridge_per_m(shape: Shape) -> float:
    """Scheduler's invocation and its target's call: the SQS send, or an API destination."""
    extra = API_DESTINATION_PER_M if shape.webhook else SQS_SEND_PER_M
    return EVENTBRIDGE_SCHEDULER_PER_M + extra


def rows(cost: dict[str, Any]) -> list[list[str]]:
    idle = float(cost["usd_per_idle_month"])
    per_m = cost["usd_per_million_fires"]
    out = []
    for shape in SHAPES:
        for fires in VOLUMES:
            ours = idle + fires / 1e6 * float(per_m[shape.scenario])
            out.append([
                shape.name,
                f"{fires:,}",
                shape.that_is(fires),
                _usd(ours),
                _usd(fires / 1e6 * eventbridge_per_m(shape)),
                _usd(fires / 1e6 * QSTASH_PER_M),
            ])  # fmt: skip
    return out


def table(cost: dict[str, Any]) -> str:
    head = ["shape", "fires a month", "that is", "this service", "EventBridge Scheduler",
            "QStash (pay as you go)"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|---|---:|---:|---:|---:|---:|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows(cost)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    path = Path((argv or sys.argv[1:] or [str(RESULTS)])[0])
    try:
        cost = json.loads(path.read_text())["cost"]
    except (OSError, ValueError, KeyError):
        print(f"no cost results in {path}: run `make bench` (or python -m bench.cost)",
              file=sys.stderr)  # fmt: skip
        return 1
    print(table(cost))
    shown = path.resolve().relative_to(ROOT) if path.resolve().is_relative_to(ROOT) else path
    print(
        f"\n(this service: the idle month ${cost['usd_per_idle_month']:.2f} plus each shape's "
        f"$ per million fires, from {shown}; prices as of {cost.get('prices_as_of', '?')})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A tenant's usage counters (claims table): what ``GET /v1/tenant/usage`` shows.

Item ``u/<tenant>/<YYYY-MM>/<shard>``: counts of that month (UTC) - ``enq`` fires enqueued,
``dlv`` delivered (an HTTP target's 2xx), ``fail`` failed, ``late`` enqueued more than 1 s
after their due time (after their flexible window's end), ``l0`` .. ``l5`` the enqueued fires
by accuracy level (timers.core.lag: each fire counted in ``enq`` is counted in one of them, in
the same ``ADD``), ``new`` timers created - and ``act``, the month's net change of active
timers (+1 for a timer that becomes active: created, resumed, reset; -1 for one that stops:
paused, deleted, completed by a change or by its last fire). Each writer adds what it recorded
in one ``ADD`` per tenant and month (a trigger run, a delivery batch, a create request, a
change), on one of USAGE_SHARDS items (its bucket's, or a random one), so a busy tenant's
counters are no hot key.

A reader sums the month's shards, and the active timers at the month's end (now, for this
month) as every ``act`` since the tenant's first month (BatchGetItem of small items, about a
hundred a decade): no scan. The counts are written after the records they count: a function
that dies between the two leaves those fires uncounted. The items never expire (9 a month).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from timers.core.lag import LAG_LEVELS, lag_level, lateness_ms
from timers.store.dynamodb import LowLevelClient

log = logging.getLogger(__name__)

USAGE_SHARDS = 8
MONTHS_BACK = 120  # how far back an active-timers sum reaches (a decade)
COUNTS = {"enqueued": "enq", "delivered": "dlv", "failed": "fail", "late_1s": "late",
          "timers_created": "new", "active": "act",
          **{level: f"l{i}" for i, level in enumerate(LAG_LEVELS)}}  # fmt: skip
"""Counter names -> their attributes. At most these 12 in one ADD: far from DynamoDB's
expression limits (4 KB, a few hundred substitutions)."""
LATE_MS = 1_000


def month_of(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m")


def months(first: str, last: str) -> list[str]:
    """``first`` to ``last`` (YYYY-MM) inclusive, at most MONTHS_BACK of them (the latest)."""
    a, b = int(first[:4]) * 12 + int(first[5:7]) - 1, int(last[:4]) * 12 + int(last[5:7]) - 1
    a = max(a, b - MONTHS_BACK + 1)
    return [f"{m // 12:04d}-{m % 12 + 1:02d}" for m in range(a, b + 1)]


class UsageCounters(LowLevelClient):
    def __init__(self, table: str, client: Any = None) -> None:
        self.table = table
        self._client = client

    def add(
        self, tenant: str, month: str, counts: Mapping[str, int], shard: int | None = None
    ) -> None:
        """Add ``counts`` (COUNTS' names) to the tenant's month; zeros are left out."""
        given = {COUNTS[name]: n for name, n in counts.items() if n}
        if not given:
            return
        shard = random.randrange(USAGE_SHARDS) if shard is None else shard % USAGE_SHARDS
        names = {f"#c{i}": attr for i, attr in enumerate(given)}
        self.client.update_item(
            TableName=self.table,
            Key={"k": {"S": f"u/{tenant}/{month}/{shard}"}},
            UpdateExpression="ADD " + ", ".join(f"{n} :c{i}" for i, n in enumerate(names)),
            ExpressionAttributeNames=names,
            ExpressionAttributeValues={
                f":c{i}": {"N": str(n)} for i, n in enumerate(given.values())
            },
        )

    def read(self, tenant: str, month: str, first_month: str) -> dict[str, Any]:
        """The contract's Usage of ``month``; active timers summed from ``first_month``."""
        span = months(min(first_month, month), month)
        keys = [f"u/{tenant}/{m}/{s}" for m in span for s in range(USAGE_SHARDS)]
        found: dict[str, dict[str, Any]] = {}
        for start in range(0, len(keys), 100):
            pending: dict[str, Any] = {
                self.table: {"Keys": [{"k": {"S": k}} for k in keys[start : start + 100]]}
            }
            while pending:
                response = self.client.batch_get_item(RequestItems=pending)
                for item in response["Responses"].get(self.table, []):
                    found[item["k"]["S"]] = item
                pending = response.get("UnprocessedKeys") or {}
        totals = dict.fromkeys(COUNTS, 0)
        active = 0
        for key, item in found.items():
            active += int(item.get("act", {}).get("N", "0"))
            if key.split("/")[2] == month:
                for name, attr in COUNTS.items():
                    totals[name] += int(item.get(attr, {}).get("N", "0"))
        return {
            "month": month,
            "fires": {k: totals[k] for k in ("enqueued", "delivered", "failed", "late_1s")},
            "lag": {level: totals[level] for level in LAG_LEVELS},
            "timers_created": totals["timers_created"],
            "active_timers": max(0, active),
        }


FINISHED = ("d", "f", "k")  # a fire log entry's states of a recorded fire: sent, failed, skipped
Recorded = tuple[str, int, int, str, bool, int]
"""A recorded fire: tenant, due ms, recorded at ms, its entry's state, its chain ended, its
timer's flexible window in ms (its accuracy level is measured from the window's end)."""


def fire_counts(recorded: Sequence[Recorded]) -> dict[tuple[str, str], dict[str, int]]:
    """Recorded fires -> counts per (tenant, month of the record). A skipped fire (misfire
    ``skip``) counts nothing but the end of its chain; an enqueued one counts in ``enqueued``
    and in its accuracy level, always together (the levels add up to ``enqueued``)."""
    out: dict[tuple[str, str], dict[str, int]] = {}
    for tenant, due, at, state, ended, window in recorded:
        counts = out.setdefault((tenant, month_of(at)), dict.fromkeys(COUNTS, 0))
        counts["active"] -= ended
        if state == "d":
            counts["enqueued"] += 1
            counts[lag_level(at - due, window)] += 1
            counts["late_1s"] += lateness_ms(at - due, window) > LATE_MS  # past its window
        elif state == "f":
            counts["failed"] += 1
    return out


def add_quietly(
    usage: Any, tenant: str, month: str, counts: Mapping[str, int], shard: int | None = None
) -> None:
    """``usage.add``, never raising: a count lost is logged - a request, a run or a batch
    never fails on its counting."""
    try:
        usage.add(tenant, month, counts, shard=shard)
    except Exception:
        log.warning("usage not counted", exc_info=True, extra={"tenant": tenant})


def count_fires(usage: Any, recorded: Sequence[Recorded], shard: int | None = None) -> None:
    """Add recorded fires to their tenants' usage, one ADD per tenant and month."""
    for (tenant, month), counts in fire_counts(recorded).items():
        add_quietly(usage, tenant, month, counts, shard)

"""Use cases of the HTTP API. Validated input in, contract views out; the fire path behind
``timers.engine.changes``.

A timer's stored item is its plan and a checkpoint; what a user sees is *derived* by walking
the fire log from that checkpoint. A change (PATCH, pause, resume, reset, delete) is one transaction
ordered with the claim of the timer's cursor (docs/fire-path.md, R5).
"""

from __future__ import annotations

import builtins
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from timers.api.creating import Creating
from timers.api.cursors import decode_cursor, encode_cursor, history_cursor
from timers.api.groups_table import GroupStore
from timers.api.idempotency import IdempotencyStore
from timers.api.views import fire_view, timer_view
from timers.core import timer as timers
from timers.core.errors import (
    FieldError,
    InvalidInput,
    InvalidState,
    NotFound,
)
from timers.core.groups import check_group, check_name
from timers.core.schedule import Plan, preview
from timers.core.timer import Timer
from timers.core.times import format_ms
from timers.delivery.records import DeliveryRecords
from timers.engine.changes import Changes
from timers.engine.entries import ref_of, resolved
from timers.engine.extra import Extras, merge
from timers.tenancy.table import Tenant
from timers.tenancy.usage import UsageCounters, add_quietly, month_of

log = logging.getLogger(__name__)

Clock = Callable[[], int]
LIST_READ_LIMIT = 1_000
"""Items one list request reads at most (payload items and other statuses included)."""
LIST_READ_BATCH = 100
"""Items read per query when a status filter may discard most of them."""
_MONTH = re.compile(r"([0-9]{4})-([0-9]{2})")  # ASCII digits: ``\d`` takes any script's


def _check_month(month: str, this_month: str) -> None:
    """A month the usage report can answer: YYYY-MM, a real month, not after this one (UTC).
    Each refusal says which of the three it is: a month that has that shape is out of range or
    in the future, not "expected YYYY-MM"."""
    shape = _MONTH.fullmatch(month)
    if shape is None:
        why = "expected YYYY-MM, e.g. 2026-11"
    elif not 1 <= int(shape[2]) <= 12:
        why = f"{month} is out of range: month {shape[2]} is not 01-12"
    elif shape[1] == "0000":
        why = f"{month} is out of range: the year is 0001 to 9999"
    elif month > this_month:  # both YYYY-MM: their order is the months' order
        why = f"{month} is in the future: this month is {this_month} (UTC)"
    else:
        return
    raise InvalidInput("invalid month", [FieldError("month", why)])


@dataclass
class TimerService(Creating):
    changes: Changes
    deliveries: DeliveryRecords
    idempotency: IdempotencyStore
    clock: Clock
    allow_loopback_targets: bool = False  # the local stack only (TIMERS_ALLOW_LOOPBACK_TARGETS)
    local_stack: bool = False  # `make run` (TIMERS_LOCAL_STACK): a refusal names its setting
    extras: Extras | None = None  # run now (None: extra fires neither run nor listed)
    usage: UsageCounters | None = None  # the tenants' usage counters (None: not counted)
    groups: GroupStore | None = None  # the tenants' groups (None: their registry not kept)

    @property
    def timers(self) -> Any:
        return self.changes.timers

    # ---------------------------------------------------------------- usage

    def status_moved(self, tenant: str, before: str, after: str | None) -> None:
        """A committed change moved a timer in or out of ``active``: the gauge follows."""
        delta = (after == "active") - (before == "active")
        if self.usage is None or not delta:
            return
        add_quietly(self.usage, tenant, month_of(self.clock()), {"active": delta})

    def usage_of(self, tenant: Tenant, month: str | None) -> dict[str, Any]:
        """The tenant's usage of ``month`` (YYYY-MM, UTC; None: this month)."""
        this_month = month_of(self.clock())
        if month is None:
            month = this_month
        else:
            _check_month(month, this_month)
        if self.usage is None:
            raise InvalidState("usage is not counted here")
        first = month_of(tenant.created_ms) if tenant.created_ms else month
        return self.usage.read(tenant.name, month, first)

    # ---------------------------------------------------------------- read

    def get(self, tenant: Tenant, timer_id: str) -> dict[str, Any]:
        return timer_view(self.changes.current(self._load(tenant, timer_id))[0])

    def list(
        self,
        tenant: Tenant,
        status: str | None,
        limit: int,
        cursor: str | None,
        group: str | None = None,
    ) -> dict[str, Any]:
        """A page of the tenant's timers by id; ``status`` filters the derived status, ``group``
        reads only that group's timers (the table's group index). One request reads at most
        LIST_READ_LIMIT items: a filtered page can be short, even empty, with a cursor to go on
        from (as DynamoDB's own filtered queries are)."""
        scope = f"timers:{status or '*'}"
        if group is not None:
            scope += f":{check_name(group)}"
        after = decode_cursor(cursor, tenant, scope)
        batch = limit if status is None else LIST_READ_BATCH
        items: builtins.list[Timer] = []
        read = 0
        while len(items) < limit and read < LIST_READ_LIMIT:
            if group is None:
                page, next_after = self.timers.page(tenant.name, after, batch)
            else:
                page, next_after = self.timers.group_page(tenant.name, group, after, batch)
            read += batch
            cursors = self.changes.walks(page, consistent=False)
            shown = [resolved(t, c) for t, c in zip(page, cursors, strict=True)]
            matches = [t for t in shown if status is None or t.status == status]
            wanted = limit - len(items)
            if len(matches) >= wanted:  # the page is full: go on after its last timer
                items += matches[:wanted]
                after = items[-1].id if next_after or len(matches) > wanted else None
                break
            items += matches
            after = next_after
            if after is None:
                break
        return {
            "items": [timer_view(t) for t in items],
            "next_cursor": encode_cursor(after, tenant, scope),
        }

    def fire_history(
        self, tenant: Tenant, timer_id: str, limit: int, cursor: str | None
    ) -> dict[str, Any]:
        """Newest first, from the fire log: the timer's chain back along ``pv``, merged with
        its extra fires (run now). The timer is found for this tenant first. A cursor holds
        where the chain goes on and the position extra fires must be below."""
        timer, at = self.changes.current(self._load(tenant, timer_id))
        scope = f"fires:{timer_id}"
        before = decode_cursor(cursor, tenant, scope)
        newest = at.pos if at.pending is not None else timer.last_fire_pos
        start, below = history_cursor(before) if before is not None else (newest, None)
        chain, more = self.changes.fires(timer, start, limit) if start is not None else ([], None)
        extras, floor = (
            self.extras.fires(timer, below, limit)
            if self.extras is not None and below != 0
            else ([], None)
        )
        fires, chain_next, extras_below = merge(chain, more, extras, floor, limit)
        refs = {pos: ref_of(timer, pos) for pos, e in fires if e.hook}
        records = self.deliveries.read_deliveries(refs.values()) if refs else {}
        go_on = None
        if chain_next is not None or extras_below:
            go_on = f"{'' if chain_next is None else chain_next}|{extras_below}"
        return {
            "items": [
                fire_view(timer.id, pos, entry, records.get(refs[pos]) if pos in refs else None)
                for pos, entry in fires
            ],
            "next_cursor": encode_cursor(go_on, tenant, scope),
        }

    def run_now(self, tenant: Tenant, timer_id: str) -> dict[str, Any]:
        """One extra fire now, besides the schedule: its own fire id, claimed like any fire,
        not counted toward max_fires, whatever the timer's status (timers.engine.extra)."""
        if self.extras is None:
            raise InvalidState("run now is not available here")

        def load() -> tuple[Timer, int | None]:
            stored = self._load(tenant, timer_id)
            return stored, self.changes.current(stored)[1].pos

        timer, pos, entry = self.extras.run(load)
        return fire_view(timer.id, pos, entry)  # an HTTP target's: on the delivery queue

    def preview(self, plan: Plan, count: int) -> dict[str, Any]:
        return {"fire_times": [format_ms(ms) for ms in preview(plan, count)]}

    def _load(self, tenant: Tenant, timer_id: str) -> Timer:
        timer = self.timers.get(tenant.name, timer_id)
        if timer is None:
            raise NotFound(f"no timer {timer_id!r}")
        return timer

    # ---------------------------------------------------------------- change

    def patch(self, tenant: Tenant, timer_id: str, changes: dict[str, Any]) -> dict[str, Any]:
        if "target" in changes:
            target = changes.pop("target") or {}
            queue_url, webhook = self._targets(
                tenant, target.get("queue_url"), target.get("url"), target.get("headers")
            )
            changes = {**changes, "target_queue_url": queue_url, "webhook": webhook}
        if changes.get("group") is not None and self.groups is not None:
            check_group(changes["group"])
            self.groups.touch(tenant.name, [changes["group"]], self.clock())
        return self._change(tenant, timer_id, lambda t, now: timers.patch(t, changes, now))

    def pause(self, tenant: Tenant, timer_id: str) -> dict[str, Any]:
        return self._change(tenant, timer_id, timers.pause)

    def resume(self, tenant: Tenant, timer_id: str) -> dict[str, Any]:
        return self._change(tenant, timer_id, timers.resume)

    def reset(self, tenant: Tenant, timer_id: str) -> dict[str, Any]:
        """Restart the schedule from now, fire count 0. It comes after a fire already claimed
        (waited for, not adopted): nothing of the old schedule is sent once it answers."""
        return self._change(tenant, timer_id, timers.reset, after_owed=True)

    def delete(self, tenant: Tenant, timer_id: str) -> None:
        self._change(tenant, timer_id, None)

    def _change(
        self,
        tenant: Tenant,
        timer_id: str,
        change: Callable[[Timer, int], Timer] | None,
        after_owed: bool = False,
    ) -> dict[str, Any]:
        changed = self.changes.change(tenant.name, timer_id, change, after_owed)
        if changed is None:
            return {}
        timer, shown = changed
        return timer_view(resolved(timer, shown))

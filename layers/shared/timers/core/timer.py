"""The timer aggregate and its state machine: create, patch, pause, resume, fire.

Pure: every function takes the current time as ``now_ms`` and returns a new ``Timer``. The
cursor ``next_fire_ms`` is the one occurrence that may fire next; an occurrence is fired only
while it equals the cursor, which is how changes win over stale copies in Redis.
"""

from __future__ import annotations

import base64
import json
import re
import secrets
from dataclasses import dataclass, replace
from typing import Any, Literal

from timers.core.errors import FieldError, InvalidInput, InvalidState, PayloadTooLarge
from timers.core.groups import check_group
from timers.core.numbers import ascii_int
from timers.core.schedule import (
    AtSchedule,
    Misfire,
    Plan,
    Schedule,
    catch_up,
    first_fire,
    is_recurring,
    next_fire,
    validate_plan,
)
from timers.core.webhooks import STORED_HEADERS, RetryPolicy, Webhook, keeping_stored_values
from timers.core.window import WINDOW_MAX_MS, grain_for

Status = Literal["active", "paused", "completed"]
STATUSES: tuple[Status, ...] = ("active", "paused", "completed")

PAYLOAD_LIMIT_BYTES = 64 * 1024
TENANT_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,39}")  # use fullmatch: "$" matches before a \n
_TIMING_FIELDS = frozenset({"schedule", "start_ms", "end_ms", "max_fires"})
_READ_ONLY = frozenset(
    {
        "tenant",
        "id",
        "anchor_ms",
        "status",
        "next_fire_ms",
        "fire_count",
        "last_fire_pos",
        "created_ms",
        "rev",
        "partition",
        "expires_ms",
        "owed",
        "grain_ms",
    }
)


@dataclass(frozen=True)
class Timer:
    tenant: str
    id: str
    schedule: Schedule
    anchor_ms: (
        int  # when the schedule was set: `after` counts from here, one clock for the first fire
    )
    target_queue_url: str
    payload_json: str  # the payload serialized once, delivered verbatim
    misfire: Misfire = "fire_once"
    name: str | None = None
    start_ms: int | None = None
    end_ms: int | None = None
    max_fires: int | None = None
    status: Status = "active"
    next_fire_ms: int | None = None  # the cursor: the one occurrence that may fire next
    fire_count: int = 0
    last_fire_pos: int | None = None  # chain position of the last claim entry (fire history)
    created_ms: int = 0
    updated_ms: int = 0
    rev: int = 0  # revision: 0 until first stored, then +1 per change (optimistic concurrency)
    partition: int = 0  # fixed at creation (timers.engine.entries.partition_for)
    expires_ms: int | None = None  # when a completed timer is deleted (retention)
    webhook: Webhook | None = None  # an HTTP target (then target_queue_url is "")
    owed: bool = False  # a fire claimed before the last change is unsent: stay findable (R4)
    retry: RetryPolicy | None = None  # how long an HTTP fire is retried (None: the default)
    window_ms: int = 0  # the flexible window: a fire lands in [due, due + window] (core.window)
    grain_ms: int = 0  # the window's alignment at creation, fixed: where its fire log entries live
    group: str | None = None  # the group it is in (core.groups); None: in none

    @property
    def plan(self) -> Plan:
        return Plan(self.schedule, self.anchor_ms, self.start_ms, self.end_ms, self.max_fires)


def new_timer_id() -> str:
    return "tmr_" + base64.b32encode(secrets.token_bytes(15)).decode().lower()


def fire_id(timer_id: str, due_ms: int) -> str:
    return f"{timer_id}:{due_ms}"


def fire_due_ms(fire: str) -> int | None:
    """The due time in a fire id (``<timer id>:<due epoch ms>``), None if it has none."""
    return ascii_int(fire.rpartition(":")[2])


def fire_timer_id(fire: str) -> str:
    return fire.rpartition(":")[0]


def serialize_payload(payload: Any, field: str = "payload") -> str:
    text = json.dumps(payload, separators=(",", ":"), ensure_ascii=False)
    if len(text.encode()) > PAYLOAD_LIMIT_BYTES:
        raise PayloadTooLarge(
            f"{field} is over {PAYLOAD_LIMIT_BYTES} bytes when serialized",
            [FieldError(field, f"must be at most {PAYLOAD_LIMIT_BYTES} bytes serialized")],
        )
    return text


def _check_plan(plan: Plan, now_ms: int, schedule_changed: bool) -> None:
    errors = validate_plan(plan, now_ms)
    if not schedule_changed:  # an unchanged one-shot may legitimately lie in the past
        errors = [e for e in errors if e.field != "schedule.at"]
    if errors:
        raise InvalidInput("the timer's schedule is invalid", errors)


def _check_retry(retry: RetryPolicy | None, webhook: Webhook | None) -> None:
    if retry is not None and (errors := retry.errors()):
        raise InvalidInput("the timer's retry policy is invalid", errors)
    if retry is not None and webhook is None:  # a queue's send is retried by the service itself
        raise InvalidInput(
            "a retry policy applies to HTTP targets only",
            [FieldError("retry", "only for a target with a url (null it for a queue target)")],
        )


def _check_window(window_ms: int) -> None:
    if not 0 <= window_ms <= WINDOW_MAX_MS:
        raise InvalidInput(
            "the timer's window is invalid",
            [FieldError("window_seconds", f"from 0 to {WINDOW_MAX_MS // 1000}")],
        )


def _settle(timer: Timer, next_ms: int | None) -> Timer:
    """Set the cursor; a timer with nothing left to fire is completed, otherwise not completed."""
    exhausted = next_ms is None or (
        timer.max_fires is not None and timer.fire_count >= timer.max_fires
    )
    if exhausted:
        return replace(timer, next_fire_ms=None, status="completed")
    status: Status = "active" if timer.status == "completed" else timer.status
    return replace(timer, next_fire_ms=next_ms, status=status)


def with_cursor(timer: Timer, next_ms: int | None) -> Timer:
    """The timer with its cursor at ``next_ms`` (completed if nothing is left)."""
    return _settle(timer, next_ms)


def create(
    tenant: str,
    timer_id: str,
    *,
    schedule: Schedule,
    target_queue_url: str,
    payload_json: str,
    now_ms: int,
    misfire: Misfire = "fire_once",
    name: str | None = None,
    start_ms: int | None = None,
    end_ms: int | None = None,
    max_fires: int | None = None,
    webhook: Webhook | None = None,
    retry: RetryPolicy | None = None,
    window_ms: int = 0,
    group: str | None = None,
) -> Timer:
    _check_retry(retry, webhook)
    _check_window(window_ms)
    check_group(group)
    timer = Timer(
        tenant=tenant,
        id=timer_id,
        schedule=schedule,
        anchor_ms=now_ms,
        target_queue_url=target_queue_url,
        payload_json=payload_json,
        misfire=misfire,
        name=name,
        start_ms=start_ms,
        end_ms=end_ms,
        max_fires=max_fires,
        created_ms=now_ms,
        updated_ms=now_ms,
        webhook=webhook,
        retry=retry,
        window_ms=window_ms,
        grain_ms=grain_for(window_ms),
        group=group,
    )
    _check_plan(timer.plan, now_ms, schedule_changed=True)
    return _settle(timer, first_fire(timer.plan))


def patch(timer: Timer, changes: dict[str, Any], now_ms: int) -> Timer:
    """Apply a PATCH. ``changes`` uses Timer field names (and STORED_HEADERS: which header
    values of the timer's webhook the new one keeps); timing changes recompute the cursor."""
    changes = dict(changes)
    headers_omitted = changes.pop(STORED_HEADERS, None)
    if headers_omitted is not None and changes.get("webhook") is not None:
        webhook, errors = keeping_stored_values(changes["webhook"], timer.webhook, headers_omitted)
        if webhook is None:
            raise InvalidInput("invalid HTTP target", errors)
        changes["webhook"] = webhook
    unknown = set(changes) - {f for f in Timer.__dataclass_fields__ if f not in _READ_ONLY}
    if unknown:
        raise ValueError(f"not patchable: {sorted(unknown)}")
    if "window_ms" in changes:
        _check_window(changes["window_ms"])
    if "group" in changes:
        check_group(changes["group"])
    schedule_changed = "schedule" in changes
    updated = replace(timer, **changes, updated_ms=now_ms)
    if {"retry", "webhook", "target_queue_url"} & set(changes):
        _check_retry(updated.retry, updated.webhook)
    if schedule_changed:
        updated = replace(updated, anchor_ms=now_ms)
    if not _TIMING_FIELDS & set(changes):
        return updated
    _check_plan(updated.plan, now_ms, schedule_changed)
    if schedule_changed:
        upcoming = first_fire(updated.plan)
    elif not is_recurring(updated.schedule):  # an unfired one-shot keeps its fire, however late
        upcoming = first_fire(updated.plan) if timer.next_fire_ms is not None else None
    else:
        upcoming = next_fire(updated.plan, _decided_until(timer, now_ms))
    return _settle(updated, upcoming)


def _decided_until(timer: Timer, now_ms: int) -> int:
    """Occurrences up to this instant are decided: the past (new bounds restart the series
    from now, as a scheduler's update does) - but not what is due within the timer's window,
    which is on time and may be waiting for its send instant - and every position the timer
    already claimed (``timer`` is settled, its owed fire counted), so a fire on its way is
    never repeated nor skipped past."""
    past = now_ms - 1 - timer.window_ms
    last = timer.last_fire_pos
    return past if last is None else max(past, last)


def pause(timer: Timer, now_ms: int) -> Timer:
    if timer.status == "completed":
        raise InvalidState("a completed timer cannot be paused")
    if timer.status == "paused":
        return timer
    return replace(timer, status="paused", updated_ms=now_ms)


def resume(timer: Timer, now_ms: int) -> Timer:
    """Reactivate; occurrences missed while paused are handled by the timer's misfire policy."""
    if timer.status == "completed":
        raise InvalidState("a completed timer cannot be resumed")
    if timer.status == "active":
        return timer
    resumed = replace(timer, status="active", updated_ms=now_ms)
    cursor = timer.next_fire_ms
    if cursor is None or cursor > now_ms:
        return resumed
    # grace 0: everything that fell due during the pause counts as missed
    decision = catch_up(timer.plan, cursor, now_ms, timer.misfire, grace_ms=0)
    upcoming = decision.fire_ms if decision.fire_ms is not None else decision.next_cursor_ms
    return _settle(resumed, upcoming)


def reset(timer: Timer, now_ms: int) -> Timer:
    """Restart the schedule at ``now_ms`` as if just created with the same definition: active
    whatever the status, no fire counted (``after`` counts from now, ``every`` from now unless
    ``start_at`` sets its series, ``cron`` and ``at`` at their next occurrence after now)."""
    if isinstance(timer.schedule, AtSchedule) and timer.schedule.at_ms <= now_ms:
        raise InvalidInput(
            "an at timer whose time has passed cannot be reset",
            [FieldError("schedule.at", "is not after now")],
        )
    restarted = replace(timer, anchor_ms=now_ms, status="active", fire_count=0, updated_ms=now_ms)
    _check_plan(restarted.plan, now_ms, schedule_changed=True)
    return _settle(restarted, first_fire(restarted.plan))


def advance(timer: Timer, fire_ms: int | None, now_ms: int) -> Timer:
    """Move the cursor past an occurrence that fired at ``fire_ms`` (or was skipped: None).

    The next cursor comes from the schedule, never from when the fire happened (no drift).
    """
    fire_count = timer.fire_count + (0 if fire_ms is None else 1)
    upcoming = next_fire(timer.plan, now_ms if fire_ms is None else fire_ms)
    return _settle(replace(timer, fire_count=fire_count), upcoming)

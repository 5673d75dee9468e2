"""Schedules and their occurrences: the pure next-fire math of the service.

Every instant is an ``int`` of epoch milliseconds (UTC). Nothing here reads a clock: the
request time (``anchor_ms``), "now" and cursors are always arguments.

Occurrence rules (the product's documented semantics):

- ``at``: one occurrence at ``at_ms``; eligible only if ``start_ms <= at_ms <= end_ms``
  (bounds that are set).
- ``after``: one occurrence at ``anchor_ms + round(seconds * 1000)``, same eligibility.
- ``every``: the series ``origin + k * period`` (k >= 0), ``period = round(seconds * 1000)``,
  ``origin = start_ms`` if set, else ``anchor_ms + period``. Only occurrences ``>= anchor_ms``
  and ``<= end_ms`` are eligible, so a start in the past never causes back-fires. Times come
  from the series, never from when a fire happened, so a recurring timer does not drift.
- ``cron``: standard 5-field cron (minute hour day-of-month month day-of-week; ranges, steps,
  lists, names such as JAN and MON; day-of-week 0 and 7 are Sunday) evaluated at whole minutes
  in an IANA time zone (default UTC). Occurrences ``t`` satisfy
  ``max(anchor_ms + 1, start_ms) <= t <= end_ms``: a timer set exactly on a matching minute
  does not fire at that very instant. As in Debian cron, when both day fields are restricted
  (neither starts with ``*``) a day matches either; otherwise it must match both.
  Daylight saving follows Debian cron, as ``cronsim`` implements it:

  * a wall-clock job, whose minute and hour fields are both fixed (neither starts with ``*``:
    ``30 2 * * *``, ``0 9-17 * * *``), is evaluated in local wall time: a local time skipped by
    spring-forward fires once, at the first real minute after the jump (02:30 -> 03:00 in
    Berlin); a local time repeated by fall-back fires once, at its first (summer-time) instant;
  * an interval job, whose minute or hour field starts with ``*`` (``*/15 * * * *``,
    ``0 * * * *``, ``0 */2 * * *``), follows real elapsed time: it fires at every real minute
    whose local wall time matches, so a repeated hour fires again and a skipped one does not.
    This is cronsim's result wherever the clock shifts by whole hours; for 30-minute shifts
    (Australia/Lord_Howe) cronsim skips matches, so interval jobs are computed here
    (timers.core.cron).

``misfire`` (what a recurring timer does with occurrences it missed while the service was down
or the timer paused) is decided by :func:`catch_up`; one-shot timers always fire, late if need
be. ``max_fires`` is counted by the caller, except in :func:`preview`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from timers.core.cron import cron_backward, cron_forward, cron_syntax_error, timezone_error
from timers.core.errors import FieldError  # re-exported: one error shape for every layer
from timers.core.times import format_ms, parse_ms, to_ms

__all__ = [
    "AT_MAX_PAST_MS",
    "MAX_SECONDS",
    "AfterSchedule",
    "AtSchedule",
    "CatchUp",
    "CronSchedule",
    "EverySchedule",
    "FieldError",
    "Misfire",
    "Plan",
    "Schedule",
    "ScheduleError",
    "catch_up",
    "first_fire",
    "is_recurring",
    "latest_due",
    "next_fire",
    "preview",
    "schedule_from_dict",
    "schedule_to_dict",
    "validate_plan",
]

Misfire = Literal["fire_once", "fire_all", "skip"]

AT_MAX_PAST_MS = 300_000
"""An ``at`` may lie this far before the request (it then fires at once); older is an error."""

MAX_SECONDS = 100 * 365 * 86_400
"""Upper bound for ``after``/``every`` seconds: keeps every instant a representable date."""


@dataclass(frozen=True)
class AtSchedule:
    at_ms: int


@dataclass(frozen=True)
class AfterSchedule:
    seconds: float


@dataclass(frozen=True)
class CronSchedule:
    expression: str
    timezone: str = "UTC"


@dataclass(frozen=True)
class EverySchedule:
    seconds: float


Schedule = AtSchedule | AfterSchedule | CronSchedule | EverySchedule


@dataclass(frozen=True)
class Plan:
    schedule: Schedule
    anchor_ms: int  # when the schedule was set (create, or PATCH of the schedule)
    start_ms: int | None = None  # no fire before it
    end_ms: int | None = None  # no fire after it (inclusive)
    max_fires: int | None = None


class ScheduleError(ValueError):
    def __init__(self, errors: list[FieldError]) -> None:
        super().__init__("; ".join(f"{e.field}: {e.message}" for e in errors))
        self.errors = errors


@dataclass(frozen=True)
class CatchUp:
    fire_ms: int | None  # the occurrence to fire now, or None
    next_cursor_ms: int | None  # the next occurrence to wait for, or None when exhausted


# --------------------------------------------------------------------------- parsing

_FIELDS: dict[str, tuple[str, ...]] = {
    "at": ("at",),
    "after": ("seconds",),
    "cron": ("expression", "timezone"),
    "every": ("seconds",),
}
_OPTIONAL = {"timezone"}


def schedule_from_dict(data: Mapping[str, Any]) -> Schedule:
    """Parse the contract's JSON shape; raise :class:`ScheduleError` naming each bad field."""
    if not isinstance(data, Mapping):
        raise ScheduleError([FieldError("schedule", "must be an object")])
    kind = data.get("type")
    if not isinstance(kind, str) or kind not in _FIELDS:
        allowed = ", ".join(_FIELDS)
        raise ScheduleError([FieldError("schedule.type", f"must be one of {allowed}")])
    errors = [
        FieldError(f"schedule.{key}", f"unknown field for a {kind!r} schedule")
        for key in data
        if key != "type" and key not in _FIELDS[kind]
    ]
    errors += [
        FieldError(f"schedule.{key}", "is required")
        for key in _FIELDS[kind]
        if key not in data and key not in _OPTIONAL
    ]
    if errors:
        raise ScheduleError(errors)

    schedule: Schedule
    if kind == "at":
        try:
            schedule = AtSchedule(parse_ms(data["at"]))
        except (TypeError, ValueError, OverflowError) as exc:
            raise ScheduleError([FieldError("schedule.at", str(exc))]) from None
    elif kind == "cron":
        expression, timezone = data["expression"], data.get("timezone")
        timezone = "UTC" if timezone is None else timezone
        if not isinstance(expression, str) or not isinstance(timezone, str):
            bad = "expression" if not isinstance(expression, str) else "timezone"
            raise ScheduleError([FieldError(f"schedule.{bad}", "must be a string")])
        schedule = CronSchedule(expression, timezone)
    else:
        seconds = data["seconds"]
        if isinstance(seconds, bool) or not isinstance(seconds, int | float):
            raise ScheduleError([FieldError("schedule.seconds", "must be a number")])
        schedule = AfterSchedule(seconds) if kind == "after" else EverySchedule(seconds)
    errors = _schedule_errors(schedule)
    if errors:
        raise ScheduleError(errors)
    return schedule


def schedule_to_dict(s: Schedule) -> dict[str, Any]:
    """The contract's JSON shape of a schedule; inverse of :func:`schedule_from_dict`."""
    match s:
        case AtSchedule(at_ms):
            return {"type": "at", "at": format_ms(at_ms)}
        case AfterSchedule(seconds):
            return {"type": "after", "seconds": seconds}
        case CronSchedule(expression, timezone):
            return {"type": "cron", "expression": expression, "timezone": timezone}
        case EverySchedule(seconds):
            return {"type": "every", "seconds": seconds}


def is_recurring(s: Schedule) -> bool:
    return isinstance(s, CronSchedule | EverySchedule)


def _schedule_errors(s: Schedule) -> list[FieldError]:
    """Errors in the schedule itself, whatever the plan around it."""
    match s:
        case AtSchedule(at_ms):
            if not _MIN_MS <= at_ms <= _MAX_MS:
                return [FieldError("schedule.at", "out of range")]
        case AfterSchedule(seconds):
            if not 0 <= seconds <= MAX_SECONDS:  # also false for NaN
                return [FieldError("schedule.seconds", f"must be between 0 and {MAX_SECONDS}")]
        case EverySchedule(seconds):
            if not 1 <= seconds <= MAX_SECONDS:
                return [FieldError("schedule.seconds", f"must be between 1 and {MAX_SECONDS}")]
        case CronSchedule(expression, timezone):
            errors = []
            if problem := cron_syntax_error(expression):
                errors.append(FieldError("schedule.expression", problem))
            if problem := timezone_error(timezone):
                errors.append(FieldError("schedule.timezone", problem))
            return errors
    return []


# Years 1..9998 keep every derived datetime inside what ``datetime`` can represent.
_MIN_MS = to_ms(datetime(1, 1, 2, tzinfo=UTC))
_MAX_MS = to_ms(datetime(9998, 12, 31, tzinfo=UTC))


# --------------------------------------------------------------------------- validation


def validate_plan(plan: Plan, now_ms: int) -> list[FieldError]:
    """Semantic checks of a whole plan at request time ``now_ms``; empty when it is fine."""
    errors = _schedule_errors(plan.schedule)
    s, start, end = plan.schedule, plan.start_ms, plan.end_ms
    for name, bound in (("start_at", start), ("end_at", end)):
        if bound is not None and not _MIN_MS <= bound <= _MAX_MS:
            errors.append(FieldError(name, "out of range: years 0001 to 9998"))
    if errors:
        return errors  # occurrences of a malformed schedule are meaningless
    if isinstance(s, AtSchedule) and s.at_ms < now_ms - AT_MAX_PAST_MS:
        errors.append(FieldError("schedule.at", "is more than 5 minutes in the past"))
    if plan.max_fires is not None and plan.max_fires < 1:
        errors.append(FieldError("max_fires", "must be at least 1"))
    if start is not None and end is not None and end <= start:
        errors.append(FieldError("end_at", "must be after start_at"))
    elif not is_recurring(s):
        due = _one_shot_due(plan)
        if start is not None and due < start:
            errors.append(FieldError("schedule", "is due before start_at"))
        if end is not None and due > end:
            errors.append(FieldError("schedule", "is due after end_at"))
    elif first_fire(plan) is None:
        errors.append(FieldError("schedule", "never fires (no occurrence within its bounds)"))
    return errors


# --------------------------------------------------------------------------- occurrences


def first_fire(plan: Plan) -> int | None:
    """The plan's first occurrence honouring start/end (for ``at``: even if slightly past)."""
    if is_recurring(plan.schedule):
        return next_fire(plan, plan.anchor_ms - 1)
    due = _one_shot_due(plan)
    return due if _within(plan, due) else None


def next_fire(plan: Plan, after_ms: int) -> int | None:
    """The first occurrence strictly after ``after_ms`` honouring start/end, not max_fires.

    None past the year 9998 too: times beyond it have no RFC 3339 form."""
    s = plan.schedule
    due: int | None
    if after_ms >= _MAX_MS:
        return None
    if isinstance(s, EverySchedule):
        period, origin = _series(plan, s)
        lowest = max(after_ms + 1, plan.anchor_ms)
        due = origin + max(0, -((origin - lowest) // period)) * period  # ceil, k >= 0
    elif isinstance(s, CronSchedule):
        # cron occurrences are strictly after the anchor and at or after start.
        floor = max(after_ms, plan.anchor_ms)
        if plan.start_ms is not None:
            floor = max(floor, plan.start_ms - 1)
        due = next(cron_forward(s.expression, s.timezone, floor), None)
    else:
        due = _one_shot_due(plan)
        due = due if due > after_ms else None
    return due if due is not None and due <= _MAX_MS and _within(plan, due) else None


def preview(plan: Plan, count: int) -> list[int]:
    """The first ``count`` occurrences honouring start/end and max_fires."""
    limit = count if plan.max_fires is None else min(count, plan.max_fires)
    times: list[int] = []
    due = first_fire(plan)
    while due is not None and len(times) < limit:
        times.append(due)
        due = next_fire(plan, due)
    return times


def latest_due(plan: Plan, cursor_ms: int, now_ms: int) -> int:
    """The latest occurrence in ``[cursor_ms, now_ms]``; ``cursor_ms`` must be an occurrence.

    Arithmetic for ``every`` (a week behind at 1 s is no loop); for cron, a reverse search
    finds a nearby occurrence and a short forward walk settles it.
    """
    s = plan.schedule
    limit = now_ms if plan.end_ms is None else min(now_ms, plan.end_ms)
    if isinstance(s, EverySchedule):
        period, origin = _series(plan, s)
        return max(cursor_ms, origin + (limit - origin) // period * period)
    if not isinstance(s, CronSchedule):
        return cursor_ms
    latest = cursor_ms
    # Reverse iteration yields real occurrences except around a fall-back fold, where local
    # wall-time order and real order disagree; only a confirmed occurrence is a safe start.
    candidate = next(cron_backward(s.expression, s.timezone, limit), None)
    if candidate is not None and latest < candidate and next_fire(plan, candidate - 1) == candidate:
        latest = candidate
    while (later := next_fire(plan, latest)) is not None and later <= limit:
        latest = later
    return latest


def catch_up(plan: Plan, cursor_ms: int, now_ms: int, misfire: Misfire, grace_ms: int) -> CatchUp:
    """What to fire now for the not-yet-fired occurrence ``cursor_ms <= now_ms``.

    A cursor within ``grace_ms`` of now, or the only occurrence due, is merely late and fires.
    Otherwise occurrences were missed: ``fire_all`` fires the cursor (the caller loops through
    the rest in order), ``fire_once`` fires only the latest due one, and ``skip`` fires the
    latest due one only if it is itself within grace. The pause/resume path uses grace 0.
    """
    fire: int | None = cursor_ms
    overdue = cursor_ms < now_ms - grace_ms
    if is_recurring(plan.schedule) and overdue and misfire != "fire_all":
        latest = latest_due(plan, cursor_ms, now_ms)
        if latest != cursor_ms and misfire == "fire_once":
            fire = latest
        elif latest != cursor_ms:  # skip
            fire = latest if latest >= now_ms - grace_ms else None
    return CatchUp(fire, next_fire(plan, now_ms if fire is None else fire))


# --------------------------------------------------------------------------- helpers


def _one_shot_due(plan: Plan) -> int:
    s = plan.schedule
    if isinstance(s, AtSchedule):
        return s.at_ms
    if isinstance(s, AfterSchedule):
        return plan.anchor_ms + round(s.seconds * 1000)
    raise TypeError(f"not a one-shot schedule: {s!r}")


def _within(plan: Plan, due: int) -> bool:
    return (plan.start_ms is None or plan.start_ms <= due) and (
        plan.end_ms is None or due <= plan.end_ms
    )


def _series(plan: Plan, s: EverySchedule) -> tuple[int, int]:
    period = round(s.seconds * 1000)
    return period, plan.anchor_ms + period if plan.start_ms is None else plan.start_ms

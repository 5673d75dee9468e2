"""Cron expressions: the strict standard 5-field syntax, and their occurrences in an IANA time
zone (the daylight-saving rules are described in timers.core.schedule, whose ``cron``
schedules these evaluate). Pure: every instant is an ``int`` of epoch milliseconds (UTC).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import NamedTuple
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from timers.core.times import from_ms, to_ms

# --------------------------------------------------------------------------- syntax


class _CronField(NamedTuple):
    name: str
    low: int
    high: int
    names: str = ""  # symbolic values, space separated; the i-th means low + i

    def value(self, text: str) -> int:
        if text.isdigit() and self.low <= int(text) <= self.high:
            return int(text)
        names = self.names.split()
        if text.upper() in names:
            return self.low + names.index(text.upper())
        hint = f" or {names[0]}-{names[-1]}" if names else ""
        raise ValueError(f"{text!r} is not in {self.low}-{self.high}{hint}")


_CRON_FIELDS = (
    _CronField("minute", 0, 59),
    _CronField("hour", 0, 23),
    _CronField("day-of-month", 1, 31),
    _CronField("month", 1, 12, "JAN FEB MAR APR MAY JUN JUL AUG SEP OCT NOV DEC"),
    _CronField("day-of-week", 0, 7, "SUN MON TUE WED THU FRI SAT"),
)
_CRON_ITEM = re.compile(r"(?:\*|([0-9A-Za-z]+)(?:-([0-9A-Za-z]+))?)(?:/([0-9]+))?")


def cron_syntax_error(expression: str) -> str | None:
    """Check standard 5-field cron strictly ourselves.

    cronsim also accepts a seconds field and Quartz-style ``L``, ``W`` and ``#``; the contract
    promises standard cron, so those are rejected here rather than silently meaning something.
    """
    if expression.strip().startswith("@"):
        return "macros such as @daily are not supported; use 5 fields, e.g. '0 0 * * *'"
    parts = expression.split()
    if len(parts) != 5:
        return f"expected 5 fields (minute hour day-of-month month day-of-week), got {len(parts)}"
    for text, field in zip(parts, _CRON_FIELDS, strict=True):
        try:
            for item in text.split(","):
                _check_cron_item(item, field)
        except ValueError as exc:
            return f"bad {field.name} field {text!r}: {exc}"
    return None


def _check_cron_item(item: str, field: _CronField) -> None:
    match = _CRON_ITEM.fullmatch(item)
    if match is None:
        raise ValueError("expected *, a value or a range, each optionally /step, e.g. 1-5 or */15")
    first, last, step = match.groups()
    values = [field.value(v) for v in (first, last) if v is not None]
    if values != sorted(values):
        raise ValueError("range runs backwards")
    if step is not None and int(step) == 0:
        raise ValueError("step must be at least 1")


def timezone_error(name: str) -> str | None:
    # "localtime" is whatever the host is set to, not an IANA name.
    if name != "localtime":
        try:
            ZoneInfo(name)
            return None
        except (ZoneInfoNotFoundError, ValueError, OSError):
            pass
    return f"unknown IANA time zone {name!r}, e.g. 'Europe/Berlin' or 'UTC'"


# --------------------------------------------------------------------------- occurrences

# Cron across time zones. cronsim (like Debian cron) treats a job whose minute and hour are both
# fixed as a wall-clock job: it steps in local time, moves a skipped time to the first minute
# after the jump and takes the first pass of a repeated one. Every other job ("interval" job)
# fires at each real minute whose local wall time matches. cronsim's zone-aware stepping gets
# those wrong when the offset shifts by 30 minutes (Lord Howe: "30 * * * *" skips 02:30 after
# the jump, and its answer depends on where the search starts), so interval jobs are matched
# here span by span: within a span of constant UTC offset it is plain calendar matching, which
# cronsim does without a zone.

_DAY_MS = 86_400_000  # scan step for offset changes: tzdata has none within a week of another


@lru_cache(maxsize=1024)
def _zone(name: str) -> ZoneInfo:
    return ZoneInfo(name)


def _is_wall_clock_job(expression: str) -> bool:
    """cronsim's own test for applying Debian cron's daylight-saving rules."""
    minute, hour = expression.split()[:2]
    return not minute.startswith("*") and not hour.startswith("*")


def cron_forward(expression: str, timezone: str, after_ms: int) -> Iterator[int]:
    """Occurrences strictly after ``after_ms``, ascending."""
    zone = _zone(timezone)
    if _is_wall_clock_job(expression):
        # Started inside the second pass of a fall-back fold, cronsim can yield the fold's
        # first-pass instant, which lies before the start: drop it.
        for dt in _cronsim(expression, from_ms(after_ms).astimezone(zone)):
            if (due := to_ms(dt)) > after_ms:
                yield due
        return
    bound, span_start = after_ms, after_ms + 1  # search (bound, ...) with span_start's offset
    while True:
        offset = _offset_ms(zone, span_start)
        wall = next(_cronsim_wall(expression, bound + offset), None)
        if wall is None:
            return
        change = _offset_change(zone, span_start, wall - offset)
        if change is None:
            yield wall - offset
            bound, span_start = wall - offset, wall - offset + 1
        else:
            bound, span_start = change - 1, change


def cron_backward(expression: str, timezone: str, bound_ms: int) -> Iterator[int]:
    """Occurrence candidates at or before ``bound_ms``, descending (to be confirmed forward)."""
    zone = _zone(timezone)
    if _is_wall_clock_job(expression):
        # cronsim's reverse search is strictly before its start; +1 ms makes the bound inclusive.
        for dt in _cronsim(expression, from_ms(bound_ms + 1).astimezone(zone), reverse=True):
            if (due := to_ms(dt)) <= bound_ms:
                yield due
        return
    while True:
        offset = _offset_ms(zone, bound_ms)
        wall = next(_cronsim_wall(expression, bound_ms + offset + 1, reverse=True), None)
        if wall is None:
            return
        change = _offset_change(zone, bound_ms, wall - offset)
        if change is None:
            yield wall - offset
            bound_ms = wall - offset - 1
        else:
            bound_ms = change


def _cronsim(expression: str, start: datetime, reverse: bool = False) -> Iterator[datetime]:
    """cronsim's matches strictly after (or before) ``start``; none for an impossible date."""
    try:
        yield from CronSim(expression, start, reverse)
    except CronSimError:
        return  # syntactically fine but matches no date at all, e.g. "0 0 30 2 *"
    except (OverflowError, ValueError):
        return  # the search ran past the year 9999 (or before 1): no occurrence there


def _cronsim_wall(expression: str, wall_ms: int, reverse: bool = False) -> Iterator[int]:
    """Calendar matches in zone-less wall-clock milliseconds."""
    for dt in _cronsim(expression, from_ms(wall_ms).replace(tzinfo=None), reverse):
        yield to_ms(dt.replace(tzinfo=UTC))


def _offset_ms(zone: ZoneInfo, ms: int) -> int:
    offset = from_ms(ms).astimezone(zone).utcoffset()
    assert offset is not None  # a ZoneInfo always has one
    return offset // timedelta(milliseconds=1)


def _offset_change(zone: ZoneInfo, origin_ms: int, to_ms_: int) -> int | None:
    """The instant nearest ``origin_ms``, going towards ``to_ms_`` (inclusive), whose UTC offset
    differs from the origin's; None if the offset holds all the way."""
    same = _offset_ms(zone, origin_ms)
    step = _DAY_MS if to_ms_ >= origin_ms else -_DAY_MS
    near = origin_ms
    while near != to_ms_:
        far = min(near + step, to_ms_) if step > 0 else max(near + step, to_ms_)
        if _offset_ms(zone, far) != same:
            while abs(far - near) > 1:  # bisect down to the millisecond
                mid = (near + far) // 2
                near, far = (mid, far) if _offset_ms(zone, mid) == same else (near, mid)
            return far
        near = far
    return None

"""Cron across daylight-saving changes: exact UTC instants, from real 2026 transitions.

Semantics under test (the contract's, Debian cron's as cronsim implements it):
- a wall-clock job (minute and hour fixed) whose local time is skipped fires once, right after
  the jump; one whose local time is repeated fires once, on the first pass;
- an interval job (minute or hour starts with ``*``) follows real elapsed time.
"""

from __future__ import annotations

import bisect
from datetime import date, datetime, time, timedelta
from itertools import pairwise
from zoneinfo import ZoneInfo

import pytest
from croniter import croniter
from cronsim import CronSim

from timers.core.schedule import CronSchedule, Plan, latest_due, next_fire, preview
from timers.core.times import format_ms, from_ms, parse_ms, to_ms

MIN, HOUR = 60_000, 3_600_000

# zone, the transition's UTC instant, UTC offset just before, just after
TRANSITIONS = [
    ("Europe/Berlin", "2026-03-29T01:00:00Z", "+01:00", "+02:00"),  # 02:00 -> 03:00
    ("Europe/Berlin", "2026-10-25T01:00:00Z", "+02:00", "+01:00"),  # 03:00 -> 02:00
    ("America/New_York", "2026-03-08T07:00:00Z", "-05:00", "-04:00"),  # 02:00 -> 03:00
    ("America/New_York", "2026-11-01T06:00:00Z", "-04:00", "-05:00"),  # 02:00 -> 01:00
    ("Australia/Lord_Howe", "2026-10-03T15:30:00Z", "+10:30", "+11:00"),  # 02:00 -> 02:30
    ("Australia/Lord_Howe", "2026-04-04T15:00:00Z", "+11:00", "+10:30"),  # 02:00 -> 01:30
    ("Australia/Sydney", "2026-10-03T16:00:00Z", "+10:00", "+11:00"),  # 02:00 -> 03:00
    ("Australia/Sydney", "2026-04-04T16:00:00Z", "+11:00", "+10:00"),  # 03:00 -> 02:00
    ("America/Santiago", "2026-09-06T04:00:00Z", "-04:00", "-03:00"),  # 00:00 -> 01:00
    ("America/Santiago", "2026-04-05T03:00:00Z", "-03:00", "-04:00"),  # 00:00 -> 23:00
]


def ms(text: str) -> int:
    return parse_ms(text)


def offset(zone: str, at_ms: int) -> str:
    return from_ms(at_ms).astimezone(ZoneInfo(zone)).isoformat()[-6:]


def fires(expression: str, zone: str, after: str, count: int) -> list[str]:
    return [format_ms(t) for t in preview(Plan(CronSchedule(expression, zone), ms(after)), count)]


def fires_between(expression: str, zone: str, start_ms: int, end_ms: int) -> list[int]:
    """Occurrences in [start_ms, end_ms)."""
    plan = Plan(CronSchedule(expression, zone), start_ms - 1, end_ms=end_ms - 1)
    return preview(plan, 10_000)


@pytest.mark.parametrize(("zone", "instant", "before", "after"), TRANSITIONS)
def test_vectors_use_real_transitions(zone: str, instant: str, before: str, after: str) -> None:
    assert offset(zone, ms(instant) - 1) == before
    assert offset(zone, ms(instant)) == after


# --------------------------------------------------------------------------- wall-clock jobs

# zone, expression, anchor, the first fires (2026, UTC)
SPRING_FORWARD = [
    # the skipped time fires once, at the first real minute after the jump
    ("Europe/Berlin", "30 2 * * *", "03-28T12:00", "03-29T01:00 03-30T00:30"),  # 03:00 CEST
    ("America/New_York", "30 2 * * *", "03-07T12:00", "03-08T07:00 03-09T06:30"),  # 03:00 EDT
    ("Australia/Lord_Howe", "15 2 * * *", "10-03T00:00", "10-03T15:30 10-04T15:15"),  # 02:30
    ("Australia/Sydney", "30 2 * * *", "10-03T00:00", "10-03T16:00 10-04T15:30"),  # 03:00 AEDT
    ("America/Santiago", "0 0 * * *", "09-05T12:00", "09-06T04:00 09-07T03:00"),  # 01:00 -03
    ("America/Santiago", "30 0 * * *", "09-05T12:00", "09-06T04:00 09-07T03:30"),  # 01:00 -03
    # two skipped times collapse into one fire at the jump
    ("Europe/Berlin", "0,30 2 * * *", "03-28T12:00", "03-29T01:00 03-30T00:00 03-30T00:30"),
]
FALL_BACK = [
    # the repeated time fires once, on its first (summer-time) pass
    ("Europe/Berlin", "30 2 * * *", "10-24T12:00", "10-25T00:30 10-26T01:30"),  # CEST
    ("America/New_York", "30 1 * * *", "10-31T12:00", "11-01T05:30 11-02T06:30"),  # EDT
    ("Australia/Lord_Howe", "45 1 * * *", "04-04T00:00", "04-04T14:45 04-05T15:15"),  # +11:00
    ("Australia/Sydney", "30 2 * * *", "04-04T00:00", "04-04T15:30 04-05T16:30"),  # AEDT
    ("America/Santiago", "30 23 * * *", "04-04T12:00", "04-05T02:30 04-06T03:30"),  # -03:00
    ("Europe/Berlin", "0,30 2 * * *", "10-24T12:00", "10-25T00:00 10-25T00:30 10-26T01:00"),
]


@pytest.mark.parametrize(("zone", "expression", "anchor", "expected"), SPRING_FORWARD + FALL_BACK)
def test_wall_clock_job(zone: str, expression: str, anchor: str, expected: str) -> None:
    # Consecutive occurrences: what follows the change-day fire is the next day's, so the
    # skipped or repeated time fired exactly once.
    wanted = [f"2026-{e}:00.000Z" for e in expected.split()]
    assert fires(expression, zone, f"2026-{anchor}:00Z", len(wanted)) == wanted


def test_croniter_would_fire_the_repeated_time_twice_our_core_once() -> None:
    """Why the math is on cronsim: croniter fires Berlin's 02:30 twice on 2026-10-25."""
    start = datetime(2026, 10, 24, 14, 0, tzinfo=ZoneInfo("Europe/Berlin"))
    it = croniter("30 2 * * *", start)
    theirs = [format_ms(to_ms(it.get_next(datetime))) for _ in range(2)]
    assert theirs == ["2026-10-25T00:30:00.000Z", "2026-10-25T01:30:00.000Z"]  # CEST, then CET
    ours = fires("30 2 * * *", "Europe/Berlin", format_ms(to_ms(start)), 2)
    assert ours == ["2026-10-25T00:30:00.000Z", "2026-10-26T01:30:00.000Z"]


# --------------------------------------------------------------------------- interval jobs

# zone, the local date whose length changes, its length in hours, how often "0 * * * *" fires
CHANGE_DAYS = [
    ("Europe/Berlin", date(2026, 3, 29), 23, 23),
    ("Europe/Berlin", date(2026, 10, 25), 25, 25),
    ("America/New_York", date(2026, 3, 8), 23, 23),
    ("America/New_York", date(2026, 11, 1), 25, 25),
    ("Australia/Lord_Howe", date(2026, 10, 4), 23.5, 23),  # local 02:00 never happens
    ("Australia/Lord_Howe", date(2026, 4, 5), 24.5, 24),  # 01:30-02:00 repeats: no :00 in it
    ("Australia/Sydney", date(2026, 10, 4), 23, 23),
    ("Australia/Sydney", date(2026, 4, 5), 25, 25),
    ("America/Santiago", date(2026, 9, 6), 23, 23),  # the day starts at 01:00
    ("America/Santiago", date(2026, 4, 4), 25, 25),  # 23:00-24:00 repeats
]


def local_day(zone: str, day: date) -> tuple[int, int]:
    """[first instant, first instant of the next day) of a local date."""

    def midnight(d: date) -> int:  # a skipped midnight maps to the first instant after it
        return to_ms(datetime.combine(d, time(), tzinfo=ZoneInfo(zone)))

    return midnight(day), midnight(day + timedelta(days=1))


@pytest.mark.parametrize(("zone", "day", "hours", "hourly"), CHANGE_DAYS)
def test_interval_jobs_follow_real_elapsed_time(
    zone: str, day: date, hours: float, hourly: int
) -> None:
    start, end = local_day(zone, day)
    assert end - start == hours * HOUR
    quarter = fires_between("*/15 * * * *", zone, start, end)
    assert len(quarter) == (end - start) // (15 * MIN)
    assert all(b - a == 15 * MIN for a, b in pairwise(quarter))
    on_the_hour = fires_between("0 * * * *", zone, start, end)
    assert len(on_the_hour) == hourly
    if hours == int(hours):  # whole-hour shifts: exactly one real hour apart throughout
        assert all(b - a == HOUR for a, b in pairwise(on_the_hour))


def matching_minutes(
    zone: str, start: int, end: int, minute: set[int], hour: set[int]
) -> list[int]:
    """Brute force: every real minute in [start, end) whose local wall time matches."""
    z = ZoneInfo(zone)
    found = []
    for t in range(start, end, MIN):
        local = from_ms(t).astimezone(z)
        if local.minute in minute and local.hour in hour:
            found.append(t)
    return found


EVERY_HOUR = set(range(24))


@pytest.mark.parametrize(("zone", "day", "hours", "hourly"), CHANGE_DAYS)
@pytest.mark.parametrize(
    ("expression", "minute", "hour"),
    [
        ("*/15 * * * *", {0, 15, 30, 45}, EVERY_HOUR),
        ("0 * * * *", {0}, EVERY_HOUR),
        ("30 * * * *", {30}, EVERY_HOUR),
        ("0 */2 * * *", {0}, set(range(0, 24, 2))),
        ("*/7 1-3 * * *", set(range(0, 60, 7)), {1, 2, 3}),
        ("* * * * *", set(range(60)), EVERY_HOUR),
    ],
)
def test_interval_jobs_fire_at_every_matching_real_minute(
    zone: str,
    day: date,
    hours: float,
    hourly: int,
    expression: str,
    minute: set[int],
    hour: set[int],
) -> None:
    start, end = local_day(zone, day)
    start, end = start - HOUR, end + HOUR
    assert fires_between(expression, zone, start, end) == matching_minutes(
        zone, start, end, minute, hour
    )


def test_lord_howe_half_hour_jump_keeps_every_real_match() -> None:
    # 02:00 +10:30 jumps to 02:30 +11:00 at 15:30Z: local 02:30 exists and must fire.
    assert fires("30 * * * *", "Australia/Lord_Howe", "2026-10-03T14:50Z", 3) == [
        "2026-10-03T15:00:00.000Z",  # 01:30 +10:30
        "2026-10-03T15:30:00.000Z",  # 02:30 +11:00, the first minute after the jump
        "2026-10-03T16:30:00.000Z",  # 03:30 +11:00
    ]
    # 02:00 +11:00 falls back to 01:30 +10:30 at 15:00Z: 01:30 happens twice in real time.
    assert fires("30 * * * *", "Australia/Lord_Howe", "2026-04-04T14:20Z", 3) == [
        "2026-04-04T14:30:00.000Z",  # 01:30 +11:00
        "2026-04-04T15:00:00.000Z",  # 01:30 +10:30
        "2026-04-04T16:00:00.000Z",  # 02:30 +10:30
    ]


def test_cronsim_alone_skips_the_lord_howe_match() -> None:
    """Why interval jobs are matched span by span here rather than by cronsim's own stepping.

    If a cronsim release fixes this, the span matching can go.
    """
    start = from_ms(ms("2026-10-03T14:50:00Z")).astimezone(ZoneInfo("Australia/Lord_Howe"))
    it = CronSim("30 * * * *", start)
    theirs = [format_ms(to_ms(next(it))) for _ in range(2)]
    assert theirs == ["2026-10-03T15:00:00.000Z", "2026-10-03T16:30:00.000Z"]


# --------------------------------------------------------------------------- consistency


@pytest.mark.parametrize(("zone", "instant", "before", "after"), TRANSITIONS)
@pytest.mark.parametrize(
    "expression",
    ["30 2 * * *", "45 1 * * *", "0,30 0-3 * * *", "30 23 * * *", "0 * * * *", "*/15 * * * *"],
)
def test_next_fire_and_latest_due_agree_with_the_series(
    zone: str, instant: str, before: str, after: str, expression: str
) -> None:
    """From any point near a change, next_fire and latest_due land on the same series."""
    t0 = ms(instant)
    plan = Plan(CronSchedule(expression, zone), t0 - 30 * HOUR)
    series = preview(plan, 500)
    for t in range(t0 - 6 * HOUR, t0 + 6 * HOUR, 7 * MIN + 13):
        i = bisect.bisect_right(series, t)
        assert next_fire(plan, t) == series[i]
        if i > 0:
            assert latest_due(plan, series[0], t) == series[i - 1]


@pytest.mark.parametrize(
    ("zone", "expression", "cursor", "now", "expected"),
    [
        # now is in the second pass of the repeated hour, before wall-clock 02:30 (01:30):
        # the 02:30 (01:30) of the first pass already happened and is the latest due.
        ("Europe/Berlin", "30 2 * * *", "10-24T00:30", "10-25T01:20", "10-25T00:30"),
        ("America/New_York", "30 1 * * *", "10-31T05:30", "11-01T06:10", "11-01T05:30"),
        # now right at the jump: the moved fire is due
        ("Europe/Berlin", "30 2 * * *", "03-28T01:30", "03-29T01:00", "03-29T01:00"),
        ("Europe/Berlin", "30 2 * * *", "03-28T01:30", "03-29T00:59", "03-28T01:30"),
    ],
)
def test_latest_due_across_a_change(
    zone: str, expression: str, cursor: str, now: str, expected: str
) -> None:
    def at(text: str) -> int:
        return ms(f"2026-{text}:00Z")

    plan = Plan(CronSchedule(expression, zone), at(cursor) - 1)
    assert format_ms(latest_due(plan, at(cursor), at(now))) == format_ms(at(expected))

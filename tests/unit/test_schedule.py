"""Table-driven vectors for the schedule core: parsing, occurrences, validation, catch-up."""

from __future__ import annotations

from typing import Any

import pytest

from timers.core.schedule import (
    AfterSchedule,
    AtSchedule,
    CatchUp,
    CronSchedule,
    EverySchedule,
    Misfire,
    Plan,
    Schedule,
    ScheduleError,
    catch_up,
    first_fire,
    is_recurring,
    latest_due,
    next_fire,
    preview,
    schedule_from_dict,
    schedule_to_dict,
    validate_plan,
)
from timers.core.times import format_ms, parse_ms

T0 = parse_ms("2026-06-01T12:00:00Z")  # a Monday; the request clock of most plans below
MIN, HOUR, DAY = 60_000, 3_600_000, 86_400_000


def ms(text: str) -> int:
    return parse_ms(text)


def iso(times: list[int]) -> list[str]:
    return [format_ms(t) for t in times]


# --------------------------------------------------------------------------- parsing

VALID: list[tuple[dict[str, Any], Schedule]] = [
    ({"type": "at", "at": "2026-11-21T10:00:00Z"}, AtSchedule(ms("2026-11-21T10:00:00Z"))),
    (
        {"type": "at", "at": "2026-11-21T11:00:00.250+01:00"},
        AtSchedule(ms("2026-11-21T10:00:00.25Z")),
    ),
    ({"type": "after", "seconds": 30}, AfterSchedule(30)),
    ({"type": "after", "seconds": 0}, AfterSchedule(0)),
    ({"type": "after", "seconds": 1.5}, AfterSchedule(1.5)),
    ({"type": "every", "seconds": 1}, EverySchedule(1)),
    ({"type": "every", "seconds": 2.5}, EverySchedule(2.5)),
    (
        {"type": "cron", "expression": "0 7 * * 1-5", "timezone": "Europe/Berlin"},
        CronSchedule("0 7 * * 1-5", "Europe/Berlin"),
    ),
    ({"type": "cron", "expression": "0 7 * * 1-5"}, CronSchedule("0 7 * * 1-5", "UTC")),
    ({"type": "cron", "expression": "0 7 * * *", "timezone": None}, CronSchedule("0 7 * * *")),
]


@pytest.mark.parametrize(("data", "expected"), VALID)
def test_schedule_from_dict_parses_the_contract_shapes(
    data: dict[str, Any], expected: Schedule
) -> None:
    assert schedule_from_dict(data) == expected


@pytest.mark.parametrize(("data", "expected"), VALID)
def test_schedule_to_dict_round_trips(data: dict[str, Any], expected: Schedule) -> None:
    assert schedule_from_dict(schedule_to_dict(expected)) == expected


def test_schedule_to_dict_emits_contract_json() -> None:
    assert schedule_to_dict(AtSchedule(ms("2026-11-21T10:00:00Z"))) == {
        "type": "at",
        "at": "2026-11-21T10:00:00.000Z",
    }
    assert schedule_to_dict(CronSchedule("0 7 * * 1-5")) == {
        "type": "cron",
        "expression": "0 7 * * 1-5",
        "timezone": "UTC",
    }
    assert schedule_to_dict(AfterSchedule(30)) == {"type": "after", "seconds": 30}
    assert schedule_to_dict(EverySchedule(60)) == {"type": "every", "seconds": 60}


INVALID: list[tuple[str, Any, set[str]]] = [
    ("not an object", ["at"], {"schedule"}),
    ("no type", {}, {"schedule.type"}),
    ("unknown type", {"type": "weekly"}, {"schedule.type"}),
    ("unhashable type", {"type": ["at"]}, {"schedule.type"}),
    ("at missing", {"type": "at"}, {"schedule.at"}),
    ("at not a time", {"type": "at", "at": "tomorrow"}, {"schedule.at"}),
    ("at without offset", {"type": "at", "at": "2026-11-21T10:00:00"}, {"schedule.at"}),
    ("at as a number", {"type": "at", "at": 1_790_000_000}, {"schedule.at"}),
    ("at year 0001", {"type": "at", "at": "0001-01-01T00:00:00Z"}, {"schedule.at"}),
    (
        "extra field",
        {"type": "at", "at": "2026-11-21T10:00:00Z", "seconds": 3},
        {"schedule.seconds"},
    ),
    ("after negative", {"type": "after", "seconds": -1}, {"schedule.seconds"}),
    ("after as string", {"type": "after", "seconds": "30"}, {"schedule.seconds"}),
    ("after as bool", {"type": "after", "seconds": True}, {"schedule.seconds"}),
    ("after NaN", {"type": "after", "seconds": float("nan")}, {"schedule.seconds"}),
    ("after infinite", {"type": "after", "seconds": float("inf")}, {"schedule.seconds"}),
    ("after huge", {"type": "after", "seconds": 10**400}, {"schedule.seconds"}),
    ("every below 1", {"type": "every", "seconds": 0.5}, {"schedule.seconds"}),
    ("every missing", {"type": "every"}, {"schedule.seconds"}),
    ("every extra", {"type": "every", "seconds": 5, "at": "x"}, {"schedule.at"}),
    ("cron 6 fields", {"type": "cron", "expression": "0 0 * * * *"}, {"schedule.expression"}),
    ("cron not a string", {"type": "cron", "expression": 5}, {"schedule.expression"}),
    ("cron missing", {"type": "cron", "timezone": "UTC"}, {"schedule.expression"}),
    (
        "cron tz misspelt key",
        {"type": "cron", "expression": "* * * * *", "tz": "UTC"},
        {"schedule.tz"},
    ),
    (
        "cron unknown zone",
        {"type": "cron", "expression": "0 7 * * *", "timezone": "Mars/Olympus"},
        {"schedule.timezone"},
    ),
    (
        "cron both bad",
        {"type": "cron", "expression": "bad", "timezone": "Nope/Nope"},
        {"schedule.expression", "schedule.timezone"},
    ),
]


@pytest.mark.parametrize(("data", "fields"), [c[1:] for c in INVALID], ids=[c[0] for c in INVALID])
def test_schedule_from_dict_names_each_bad_field(data: Any, fields: set[str]) -> None:
    with pytest.raises(ScheduleError) as caught:
        schedule_from_dict(data)
    assert {e.field for e in caught.value.errors} == fields
    assert all(e.message for e in caught.value.errors)
    assert isinstance(caught.value, ValueError)


@pytest.mark.parametrize(
    "expression",
    [
        "0 7 * * 1-5",
        "*/15 * * * *",
        "0 0 1 JAN,jul *",
        "0 9-17/2 * * MON-FRI",
        "5,10,15 * * * *",
        "0 0 * * 7",
        "0 0 * * SUN",
        "59 23 31 12 6",
        "0-59/5 0-23 1-31 1-12 0-7",
        "5/15 * * * *",
        "  0  7 * * *  ",
        "0 0 30 2 *",  # well-formed; that it never fires is validate_plan's business
    ],
)
def test_cron_accepts_standard_five_field_syntax(expression: str) -> None:
    assert schedule_from_dict({"type": "cron", "expression": expression}) == CronSchedule(
        expression
    )


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("0 0 * * * *", "expected 5 fields"),
        ("0 0 * *", "expected 5 fields"),
        ("", "got 0"),
        ("@daily", "macros"),
        ("@reboot", "macros"),
        ("60 * * * *", "bad minute field"),
        ("* 24 * * *", "bad hour field"),
        ("* * 0 * *", "bad day-of-month field"),
        ("* * * 13 *", "bad month field"),
        ("* * * * 8", "bad day-of-week field"),
        ("5-1 * * * *", "backwards"),
        ("*/0 * * * *", "step must be at least 1"),
        ("* * L * *", "bad day-of-month field"),
        ("* * 15W * *", "bad day-of-month field"),
        ("* * * * 5L", "bad day-of-week field"),
        ("* * * * MON#2", "bad day-of-week field"),
        ("* * ? * *", "bad day-of-month field"),
        ("* * * MON *", "bad month field"),
        ("* * * * JAN", "bad day-of-week field"),
        ("1,,2 * * * *", "bad minute field"),
        ("*-5 * * * *", "bad minute field"),
        ("-5 * * * *", "bad minute field"),
    ],
)
def test_cron_rejects_anything_but_standard_five_field_cron(expression: str, message: str) -> None:
    with pytest.raises(ScheduleError) as caught:
        schedule_from_dict({"type": "cron", "expression": expression})
    [error] = caught.value.errors
    assert error.field == "schedule.expression"
    assert message in error.message


@pytest.mark.parametrize("zone", ["", "localtime", "europe/berlin", "../etc/passwd", "America"])
def test_cron_rejects_what_is_not_an_iana_zone(zone: str) -> None:
    with pytest.raises(ScheduleError) as caught:
        schedule_from_dict({"type": "cron", "expression": "* * * * *", "timezone": zone})
    assert [e.field for e in caught.value.errors] == ["schedule.timezone"]


@pytest.mark.parametrize(
    ("schedule", "recurring"),
    [
        (AtSchedule(T0), False),
        (AfterSchedule(1), False),
        (EverySchedule(1), True),
        (CronSchedule("* * * * *"), True),
    ],
)
def test_is_recurring(schedule: Schedule, recurring: bool) -> None:
    assert is_recurring(schedule) is recurring


# --------------------------------------------------------------------------- occurrences


def t(text: str) -> int:
    """An instant: ``HH:MM[:SS[.fff]]`` on 2026-06-01 UTC, or a full RFC 3339 date-time."""
    return ms(text if "T" in text else f"2026-06-01T{text}Z")


def times(text: str) -> list[str]:
    return iso([t(x) for x in text.split()])


def every(seconds: float, **bounds: int) -> Plan:
    return Plan(EverySchedule(seconds), T0, **bounds)


def cron(expression: str, zone: str = "UTC", anchor: int = T0, **bounds: int) -> Plan:
    return Plan(CronSchedule(expression, zone), anchor, **bounds)


def one_shot(schedule: AtSchedule | AfterSchedule, **bounds: int) -> Plan:
    return Plan(schedule, T0, **bounds)


# T0 is 2026-06-01 12:00 UTC, a Monday: the request clock.
PREVIEWS = [
    # at: its instant, if inside the bounds (both inclusive); slightly past is fine
    ("at", one_shot(AtSchedule(t("13:00"))), 5, "13:00"),
    ("at slightly past", one_shot(AtSchedule(t("11:58"))), 5, "11:58"),
    ("at == start", one_shot(AtSchedule(t("13:00")), start_ms=t("13:00")), 5, "13:00"),
    ("at == end", one_shot(AtSchedule(t("13:00")), end_ms=t("13:00")), 5, "13:00"),
    ("at before start", one_shot(AtSchedule(t("13:00")), start_ms=t("13:00:00.001")), 5, ""),
    ("at after end", one_shot(AtSchedule(t("13:00")), end_ms=t("12:59:59.999")), 5, ""),
    # after: from the request clock, fractional seconds rounded to the millisecond
    ("after", one_shot(AfterSchedule(30)), 5, "12:00:30"),
    ("after 0", one_shot(AfterSchedule(0)), 5, "12:00"),
    ("after fractional", one_shot(AfterSchedule(1.5)), 5, "12:00:01.500"),
    ("after sub-ms", one_shot(AfterSchedule(0.0004)), 5, "12:00"),
    ("after past end", one_shot(AfterSchedule(30), end_ms=t("12:00:29.999")), 5, ""),
    # every: one period after the request, or the series from start_at
    ("every", every(60), 3, "12:01 12:02 12:03"),
    ("every fractional", every(1.5), 2, "12:00:01.500 12:00:03"),
    ("every from future start", every(60, start_ms=t("13:00")), 2, "13:00 13:01"),
    ("every start == request", every(60, start_ms=T0), 2, "12:00 12:01"),
    ("every past start: no back-fires", every(60, start_ms=t("09:59:30")), 2, "12:00:30 12:01:30"),
    ("every end inclusive", every(60, end_ms=t("12:03")), 9, "12:01 12:02 12:03"),
    ("every max_fires", every(60, max_fires=2), 9, "12:01 12:02"),
    ("every end before first", every(60, end_ms=t("12:00:59.999")), 9, ""),
    # cron: strictly after the request, at or after start, at or before end
    ("cron not at the request instant", cron("*/15 * * * *"), 2, "12:15 12:30"),
    ("cron 1 ms before a match", cron("*/15 * * * *", anchor=T0 - 1), 1, "12:00"),
    ("cron start inclusive", cron("*/15 * * * *", start_ms=t("13:00")), 2, "13:00 13:15"),
    ("cron past start", cron("*/15 * * * *", start_ms=T0 - DAY), 1, "12:15"),
    ("cron end inclusive", cron("*/15 * * * *", end_ms=t("12:45")), 9, "12:15 12:30 12:45"),
    ("cron max_fires", cron("*/15 * * * *", max_fires=1), 9, "12:15"),
    (
        "cron weekdays 07:00 Berlin (CEST), from a Friday",
        cron("0 7 * * 1-5", "Europe/Berlin", anchor=t("2026-06-05T12:00:00Z")),
        3,
        "2026-06-08T05:00Z 2026-06-09T05:00Z 2026-06-10T05:00Z",
    ),
    ("cron names in any case", cron("0 9 1 jan,JUL *"), 2, "2026-07-01T09:00Z 2027-01-01T09:00Z"),
    (
        "cron both day fields restricted: either matches",
        cron("0 0 13 * FRI"),
        4,
        "2026-06-05T00:00Z 2026-06-12T00:00Z 2026-06-13T00:00Z 2026-06-19T00:00Z",
    ),
    (
        "cron day-of-month starts with *: both must match",
        cron("0 0 */10 * MON"),
        2,
        "2026-08-31T00:00Z 2026-09-21T00:00Z",
    ),
    ("cron Sunday as 7", cron("0 0 * * 7"), 1, "2026-06-07T00:00Z"),
    ("cron leap day", cron("0 0 29 2 *"), 1, "2028-02-29T00:00Z"),
    ("cron impossible date", cron("0 0 30 2 *"), 3, ""),
    ("cron Asia/Kolkata, +05:30", cron("0 9 * * *", "Asia/Kolkata"), 1, "2026-06-02T03:30Z"),
]


@pytest.mark.parametrize(
    ("plan", "count", "expected"), [c[1:] for c in PREVIEWS], ids=[c[0] for c in PREVIEWS]
)
def test_preview(plan: Plan, count: int, expected: str) -> None:
    assert iso(preview(plan, count)) == times(expected)
    first = first_fire(plan)
    assert iso([] if first is None else [first]) == times(expected)[:1]


NEXT_FIRES = [
    ("one-shot before its time", one_shot(AfterSchedule(30)), "12:00:29.999", "12:00:30"),
    ("one-shot at its time", one_shot(AfterSchedule(30)), "12:00:30", ""),
    ("one-shot after its time", one_shot(AtSchedule(T0)), "13:00", ""),
    ("every mid-period", every(60), "12:05:30", "12:06"),
    ("every on an occurrence", every(60), "12:05", "12:06"),
    ("every before the request", every(60), "00:00", "12:01"),
    (
        "every before a future start",
        every(60, start_ms=t("2026-06-02T00:00Z")),
        "12:30",
        "2026-06-02T00:00Z",
    ),
    ("every past end", every(60, end_ms=t("12:05")), "12:05", ""),
    ("cron strictly after", cron("0 * * * *"), "13:00", "14:00"),
    ("cron 1 ms before", cron("0 * * * *"), "13:59:59.999", "14:00"),
    ("cron past end", cron("0 * * * *", end_ms=t("14:00")), "14:00", ""),
    ("cron impossible date", cron("0 0 30 2 *"), "13:00", ""),
]


@pytest.mark.parametrize(
    ("plan", "after", "expected"), [c[1:] for c in NEXT_FIRES], ids=[c[0] for c in NEXT_FIRES]
)
def test_next_fire(plan: Plan, after: str, expected: str) -> None:
    found = next_fire(plan, t(after))
    assert iso([] if found is None else [found]) == times(expected)


def test_next_fire_ignores_max_fires_which_the_caller_counts() -> None:
    assert next_fire(every(60, max_fires=1), t("12:10")) == t("12:11")


# --------------------------------------------------------------------------- validation

VALIDATIONS = [
    ("fine one-shot", one_shot(AtSchedule(T0 + HOUR)), []),
    ("fine recurring", cron("0 7 * * 1-5", "Europe/Berlin", max_fires=3), []),
    ("at 5 min past", one_shot(AtSchedule(T0 - 300_000)), []),
    ("at older than 5 min", one_shot(AtSchedule(T0 - 300_001)), ["schedule.at"]),
    ("end == start", every(60, start_ms=T0 + HOUR, end_ms=T0 + HOUR), ["end_at"]),
    ("end before start", every(60, start_ms=T0 + HOUR, end_ms=T0), ["end_at"]),
    ("at before start", one_shot(AtSchedule(T0 + HOUR), start_ms=T0 + 2 * HOUR), ["schedule"]),
    ("after past end", one_shot(AfterSchedule(120), end_ms=T0 + MIN), ["schedule"]),
    ("every ends before first", every(60, end_ms=T0 + 30_000), ["schedule"]),
    ("cron never matches", cron("0 0 30 2 *"), ["schedule"]),
    ("cron ends before first", cron("0 0 1 * *", end_ms=T0 + DAY), ["schedule"]),
    ("max_fires 0", every(60, max_fires=0), ["max_fires"]),
    ("max_fires negative", one_shot(AfterSchedule(1), max_fires=-1), ["max_fires"]),
    ("every below 1 s", every(0.5), ["schedule.seconds"]),
    ("after negative", one_shot(AfterSchedule(-1)), ["schedule.seconds"]),
    ("bad cron", cron("61 * * * *"), ["schedule.expression"]),
    ("bad zone", cron("* * * * *", "Nowhere/Land"), ["schedule.timezone"]),
    ("several at once", one_shot(AtSchedule(T0 - HOUR), max_fires=0), ["schedule.at", "max_fires"]),
    # Found by fuzzing: bounds past the year 9998 crashed the formatter (500), and so did
    # occurrences a schedule would only reach there.
    ("start past 9998", every(60, start_ms=ms("9999-06-01T00:00:00Z")), ["start_at"]),
    ("end before year 1", every(60, end_ms=ms("0001-01-01T00:00:00Z")), ["end_at"]),
    ("every past 9998", every(86_400, start_ms=ms("9998-12-30T12:00:00Z")), []),
    ("cron past 9998", cron("0 0 29 2 *", start_ms=ms("9998-03-01T00:00:00Z")), ["schedule"]),
]


@pytest.mark.parametrize(
    ("plan", "fields"), [c[1:] for c in VALIDATIONS], ids=[c[0] for c in VALIDATIONS]
)
def test_validate_plan(plan: Plan, fields: list[str]) -> None:
    errors = validate_plan(plan, now_ms=T0)
    assert [e.field for e in errors] == fields
    assert all(e.message for e in errors)


def test_occurrences_stop_at_the_end_of_the_year_9998_and_format_with_four_digit_years() -> None:
    last_day = every(86_400, start_ms=ms("9998-12-29T00:00:00Z"))
    assert iso(preview(last_day, 10)) == ["9998-12-29T00:00:00.000Z", "9998-12-30T00:00:00.000Z",
                                          "9998-12-31T00:00:00.000Z"]  # fmt: skip
    assert next_fire(cron("0 0 29 2 *"), ms("9998-03-01T00:00:00Z")) is None
    early = one_shot(AtSchedule(ms("0605-08-21T21:11:51Z")))
    assert iso(preview(early, 1)) == ["0605-08-21T21:11:51.000Z"]


# --------------------------------------------------------------------------- catch-up


def test_latest_due_of_every_is_arithmetic() -> None:
    every_second = every(1)
    assert latest_due(every_second, T0 + 1000, T0 + 7 * DAY + 500) == T0 + 7 * DAY
    # 3e9 occurrences behind: only arithmetic answers this at all.
    century = 100 * 365 * DAY
    assert latest_due(every_second, T0 + 1000, T0 + century + 999) == T0 + century


LATEST_DUES = [
    ("every, cursor is now", every(60), "12:10", "12:10", "12:10"),
    ("every, before the next", every(60), "12:10", "12:10:59.999", "12:10"),
    ("every, on the next", every(60), "12:10", "12:11", "12:11"),
    ("every, behind", every(60), "12:10", "13:10:00.001", "13:10"),
    ("every, end", every(60, end_ms=t("12:13:00.001")), "12:10", "13:10", "12:13"),
    ("one-shot", one_shot(AfterSchedule(30)), "12:00:30", "2026-06-02T00:00Z", "12:00:30"),
    (
        "cron, a year behind",
        cron("* * * * *"),
        "12:10",
        "2027-06-01T12:10:00.001Z",
        "2027-06-01T12:10Z",
    ),
    ("cron, interval", cron("*/15 * * * *"), "12:15", "13:59:59.999", "13:45"),
    (
        "cron, end",
        cron("0 * * * *", end_ms=t("17:00:00.001")),
        "13:00",
        "2026-06-02T00:00Z",
        "17:00",
    ),
    (
        "cron, sparse",
        cron("0 0 29 2 *"),
        "2028-02-29T00:00Z",
        "2035-01-01T00:00Z",
        "2032-02-29T00:00Z",
    ),
]


@pytest.mark.parametrize(
    ("plan", "cursor", "now", "expected"),
    [c[1:] for c in LATEST_DUES],
    ids=[c[0] for c in LATEST_DUES],
)
def test_latest_due(plan: Plan, cursor: str, now: str, expected: str) -> None:
    assert format_ms(latest_due(plan, t(cursor), t(now))) == format_ms(t(expected))


# An every-minute timer whose cursor is 12:10 (fires on whole minutes); grace 5 s by default.
# Columns: misfire, grace, now, fired ("" = nothing), next cursor.
CATCH_UPS: list[tuple[str, Misfire, int, str, str, str]] = [
    # on time, or merely late: the cursor fires whatever the policy
    ("on time", "skip", 5_000, "12:10", "12:10", "12:11"),
    ("late within grace", "skip", 5_000, "12:10:03", "12:10", "12:11"),
    ("late, the only one due", "skip", 5_000, "12:10:30", "12:10", "12:11"),
    ("late, the only one due, resume", "skip", 0, "12:10:30", "12:10", "12:11"),
    # behind by more than one occurrence: the policy decides
    ("behind: fire_all fires the cursor", "fire_all", 5_000, "12:20:02", "12:10", "12:11"),
    ("behind: fire_once fires the latest", "fire_once", 5_000, "12:20:30", "12:20", "12:21"),
    ("behind: skip fires the latest on time", "skip", 5_000, "12:20:02", "12:20", "12:21"),
    ("behind: skip fires none late", "skip", 5_000, "12:20:30", "", "12:21"),
    # the pause/resume path: grace 0
    ("resume: fire_all", "fire_all", 0, "12:20:00.001", "12:10", "12:11"),
    ("resume: fire_once", "fire_once", 0, "12:20:00.001", "12:20", "12:21"),
    ("resume: skip", "skip", 0, "12:20:00.001", "", "12:21"),
    ("resume on an occurrence: skip", "skip", 0, "12:20", "12:20", "12:21"),
]


@pytest.mark.parametrize(
    ("misfire", "grace", "now", "fired", "cursor"),
    [c[1:] for c in CATCH_UPS],
    ids=[c[0] for c in CATCH_UPS],
)
def test_catch_up(misfire: Misfire, grace: int, now: str, fired: str, cursor: str) -> None:
    step = catch_up(every(60), t("12:10"), t(now), misfire, grace)
    assert step == CatchUp(t(fired) if fired else None, t(cursor))


@pytest.mark.parametrize(
    ("plan", "cursor", "now", "misfire", "expected"),
    [
        # several occurrences inside the grace window: the cursor is merely late
        (every(1), "12:00:07", "12:00:10", "skip", CatchUp(t("12:00:07"), t("12:00:08"))),
        # one-shots are never lost, whatever the policy
        (one_shot(AfterSchedule(30)), "12:00:30", "13:00", "skip", CatchUp(t("12:00:30"), None)),
        (one_shot(AtSchedule(T0)), "12:00", "2026-06-02T00:00Z", "fire_once", CatchUp(T0, None)),
        # exhausted by end_at
        (every(60, end_ms=t("12:10")), "12:10", "13:00", "fire_all", CatchUp(t("12:10"), None)),
        (every(60, end_ms=t("12:13")), "12:10", "13:00", "fire_once", CatchUp(t("12:13"), None)),
        (every(60, end_ms=t("12:13")), "12:10", "13:00", "skip", CatchUp(None, None)),
        # cron
        (cron("*/15 * * * *"), "12:15", "14:01", "fire_once", CatchUp(t("14:00"), t("14:15"))),
        (cron("*/15 * * * *"), "12:15", "14:01", "fire_all", CatchUp(t("12:15"), t("12:30"))),
        (cron("*/15 * * * *"), "12:15", "14:00:03", "skip", CatchUp(t("14:00"), t("14:15"))),
        (cron("*/15 * * * *"), "12:15", "14:06", "skip", CatchUp(None, t("14:15"))),
    ],
)
def test_catch_up_edges(
    plan: Plan, cursor: str, now: str, misfire: Misfire, expected: CatchUp
) -> None:
    assert catch_up(plan, t(cursor), t(now), misfire, 5_000) == expected


def test_fire_all_walks_every_missed_occurrence_in_order() -> None:
    fired: list[int | None] = []
    cursor: int | None = t("12:10")
    now = t("12:15:02")
    while cursor is not None and cursor <= now:
        step = catch_up(every(60), cursor, now, "fire_all", 5_000)
        fired.append(step.fire_ms)
        cursor = step.next_cursor_ms
    assert fired == [t(f"12:1{k}") for k in range(6)]
    assert cursor == t("12:16")

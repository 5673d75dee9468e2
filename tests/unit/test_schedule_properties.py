"""Invariants of the schedule core, for any plan (hypothesis)."""

from __future__ import annotations

from itertools import pairwise

from hypothesis import given, settings
from hypothesis import strategies as st

from timers.core.schedule import (
    AfterSchedule,
    AtSchedule,
    CronSchedule,
    EverySchedule,
    Misfire,
    Plan,
    Schedule,
    catch_up,
    first_fire,
    is_recurring,
    latest_due,
    next_fire,
    preview,
    schedule_from_dict,
    schedule_to_dict,
)
from timers.core.times import parse_ms

examples = settings(max_examples=150, deadline=None)  # per test: no global profile change

SECOND, HOUR, DAY = 1000, 3_600_000, 86_400_000
YEAR_START = parse_ms("2026-01-01T00:00:00Z")

# Anchors cluster around real daylight-saving changes, where cron math is most fragile.
CHANGES = [
    parse_ms(t)
    for t in (
        "2026-03-29T01:00:00Z",  # Europe/Berlin
        "2026-10-25T01:00:00Z",
        "2026-03-08T07:00:00Z",  # America/New_York
        "2026-11-01T06:00:00Z",
        "2026-10-03T15:30:00Z",  # Australia/Lord_Howe
        "2026-04-04T15:00:00Z",
        "2026-09-06T04:00:00Z",  # America/Santiago
        "2026-04-05T03:00:00Z",
    )
]
ZONES = [
    "UTC",
    "Europe/Berlin",
    "America/New_York",
    "Australia/Lord_Howe",
    "Australia/Sydney",
    "America/Santiago",
    "Asia/Kolkata",
]

instants = st.one_of(
    st.integers(YEAR_START, YEAR_START + 365 * DAY),
    st.sampled_from(CHANGES).flatmap(lambda c: st.integers(c - 2 * DAY, c + 2 * DAY)),
)
cron_expressions = st.builds(
    " ".join,
    st.tuples(
        st.sampled_from(["*", "*/15", "0", "30", "0,30", "5-10", "*/7"]),
        st.sampled_from(["*", "*/2", "2", "1-3", "0", "23"]),
        st.sampled_from(["*", "1", "13", "31", "*/10"]),
        st.sampled_from(["*", "1-6", "FEB", "*/3"]),
        st.sampled_from(["*", "MON-FRI", "0", "7", "SAT"]),
    ),
)


@st.composite
def plans(draw: st.DrawFn, kinds: tuple[str, ...] = ("at", "after", "every", "cron")) -> Plan:
    anchor = draw(instants)
    kind = draw(st.sampled_from(kinds))
    schedule: Schedule
    if kind == "at":
        schedule = AtSchedule(draw(st.integers(anchor - 300_000, anchor + 30 * DAY)))
    elif kind == "after":
        schedule = AfterSchedule(draw(st.floats(0, 10 * DAY / 1000) | st.integers(0, 86_400)))
    elif kind == "every":
        schedule = EverySchedule(draw(st.floats(1, 2 * DAY / 1000) | st.integers(1, 3600)))
    else:
        schedule = CronSchedule(draw(cron_expressions), draw(st.sampled_from(ZONES)))
    bound = st.none() | st.integers(anchor - DAY, anchor + 60 * DAY)
    return Plan(
        schedule,
        anchor,
        start_ms=draw(bound),
        end_ms=draw(bound),
        max_fires=draw(st.none() | st.integers(1, 20)),
    )


def within(plan: Plan, t: int) -> bool:
    return (plan.start_ms is None or t >= plan.start_ms) and (
        plan.end_ms is None or t <= plan.end_ms
    )


@examples
@given(plans(), st.integers(-DAY, 90 * DAY))
def test_next_fire_is_strictly_later_and_within_bounds(plan: Plan, offset: int) -> None:
    after = plan.anchor_ms + offset
    found = next_fire(plan, after)
    if found is not None:
        assert found > after
        assert within(plan, found)


@examples
@given(plans(), st.integers(-DAY, 30 * DAY), st.floats(0, 1))
def test_next_fire_is_the_same_from_anywhere_before_it(
    plan: Plan, offset: int, fraction: float
) -> None:
    """No occurrence hides between a point and its next fire (so the series is one series)."""
    after = plan.anchor_ms + offset
    found = next_fire(plan, after)
    if found is not None:
        later = after + int((found - after - 1) * fraction)
        assert next_fire(plan, later) == found


@examples
@given(plans(), st.integers(1, 30))
def test_preview_is_the_series_of_next_fires(plan: Plan, count: int) -> None:
    times = preview(plan, count)
    assert len(times) <= count
    assert plan.max_fires is None or len(times) <= plan.max_fires
    assert all(a < b for a, b in pairwise(times))
    assert all(within(plan, t) for t in times)
    if times:
        assert times[0] == first_fire(plan)
        assert all(next_fire(plan, a) == b for a, b in pairwise(times))
    if not is_recurring(plan.schedule):
        assert len(times) <= 1


@examples
@given(plans(("every", "cron")), st.integers(2, 30))
def test_recurring_fires_never_precede_the_request(plan: Plan, count: int) -> None:
    times = preview(plan, count)
    assert all(t >= plan.anchor_ms for t in times)
    if isinstance(plan.schedule, CronSchedule):  # strictly after, on whole minutes
        assert all(t > plan.anchor_ms and t % 60_000 == 0 for t in times)


@examples
@given(plans(("every",)))
def test_every_is_spaced_exactly_one_period(plan: Plan) -> None:
    assert isinstance(plan.schedule, EverySchedule)
    period = round(plan.schedule.seconds * 1000)
    times = preview(plan, 20)
    assert all(b - a == period for a, b in pairwise(times))
    origin = plan.anchor_ms + period if plan.start_ms is None else plan.start_ms
    assert all((t - origin) % period == 0 for t in times)


@st.composite
def behind(draw: st.DrawFn) -> tuple[Plan, int, int]:
    """A plan, a cursor (an occurrence not fired yet) and a now at or after it."""
    plan = draw(plans())
    times = preview(plan, 20)
    if not times:
        plan = Plan(EverySchedule(draw(st.integers(1, 3600))), plan.anchor_ms)
        times = preview(plan, 20)
    cursor = draw(st.sampled_from(times))
    now = cursor + draw(st.integers(0, 3 * SECOND) | st.integers(0, 30 * DAY))
    return plan, cursor, now


@examples
@given(behind())
def test_latest_due_is_the_last_occurrence_up_to_now(case: tuple[Plan, int, int]) -> None:
    plan, cursor, now = case
    latest = latest_due(plan, cursor, now)
    assert cursor <= latest <= now
    assert latest == cursor or next_fire(plan, latest - 1) == latest
    after = next_fire(plan, latest)
    assert after is None or after > now


MISFIRES: list[Misfire] = ["fire_once", "fire_all", "skip"]


@examples
@given(behind(), st.sampled_from(MISFIRES), st.sampled_from([0, 1000, 5000, 60_000]))
def test_catch_up_fires_within_cursor_and_now(
    case: tuple[Plan, int, int], misfire: Misfire, grace: int
) -> None:
    plan, cursor, now = case
    step = catch_up(plan, cursor, now, misfire, grace)
    if step.fire_ms is not None:
        assert cursor <= step.fire_ms <= now
        assert step.next_cursor_ms is None or step.next_cursor_ms > step.fire_ms
    else:
        assert misfire == "skip"
        assert step.next_cursor_ms is None or step.next_cursor_ms > now
    if misfire == "fire_all" or not is_recurring(plan.schedule):
        assert step.fire_ms == cursor  # nothing is ever dropped
    if step.next_cursor_ms is not None:
        assert within(plan, step.next_cursor_ms)


@examples
@given(plans())
def test_schedule_dict_round_trip(plan: Plan) -> None:
    assert schedule_from_dict(schedule_to_dict(plan.schedule)) == plan.schedule

"""The timer state machine: cursor, completion, pause/resume with misfire, patch."""

from __future__ import annotations

from dataclasses import replace

import pytest

from timers.core import timer as t
from timers.core.errors import InvalidInput, InvalidState, PayloadTooLarge
from timers.core.schedule import (
    AfterSchedule,
    AtSchedule,
    CronSchedule,
    EverySchedule,
    Misfire,
    Schedule,
)

T0 = 1_795_255_200_000  # 2026-11-21T10:00:00Z
MIN = 60_000


def every_minute(misfire: Misfire = "fire_once", **kw: int) -> t.Timer:
    return t.create(
        "acme",
        "tmr_1",
        schedule=EverySchedule(60),
        target_queue_url="q",
        payload_json="null",
        now_ms=T0,
        misfire=misfire,
        **kw,
    )


def test_create_sets_the_first_cursor_from_the_request_clock() -> None:
    timer = t.create(
        "acme",
        "tmr_1",
        schedule=AfterSchedule(2.5),
        target_queue_url="q",
        payload_json="{}",
        now_ms=T0,
    )
    assert (timer.status, timer.next_fire_ms, timer.anchor_ms) == ("active", T0 + 2500, T0)


def test_create_rejects_a_plan_that_never_fires() -> None:
    with pytest.raises(InvalidInput) as err:
        t.create(
            "acme",
            "tmr_1",
            schedule=CronSchedule("0 0 30 2 *"),
            target_queue_url="q",
            payload_json="null",
            now_ms=T0,
        )
    assert [e.field for e in err.value.details] == ["schedule"]


@pytest.mark.parametrize(
    ("misfire", "cursor_after_resume"),
    [("fire_all", T0 + MIN), ("fire_once", T0 + 3 * MIN), ("skip", T0 + 4 * MIN)],
)
def test_resume_applies_the_misfire_policy(misfire: Misfire, cursor_after_resume: int) -> None:
    paused = t.pause(every_minute(misfire), T0 + 1000)
    resumed = t.resume(paused, T0 + 3 * MIN + 30_000)  # 10:01, 10:02, 10:03 missed
    assert resumed.status == "active"
    assert resumed.next_fire_ms == cursor_after_resume


def test_pause_and_resume_are_idempotent_and_refuse_completed_timers() -> None:
    timer = every_minute()
    assert t.resume(timer, T0) is timer
    paused = t.pause(timer, T0)
    assert t.pause(paused, T0 + 5) is paused
    done = t.patch(replace(timer, fire_count=1), {"max_fires": 1}, T0)
    assert done.status == "completed"
    for change in (t.pause, t.resume):
        with pytest.raises(InvalidState):
            change(done, T0)


def test_patch_of_schedule_reanchors_at_the_patch_time() -> None:
    timer = t.patch(every_minute(), {"schedule": AfterSchedule(5)}, T0 + 7000)
    assert (timer.anchor_ms, timer.next_fire_ms) == (T0 + 7000, T0 + 12_000)


def test_patch_of_name_keeps_the_cursor() -> None:
    timer = every_minute()
    assert t.patch(timer, {"name": "x"}, T0 + 30_000).next_fire_ms == timer.next_fire_ms


def test_new_bounds_restart_from_now_and_never_before_a_claimed_fire() -> None:
    """The change sees the timer settled (an owed fire counted): new bounds take the next
    occurrence from now on - but never one at or before the last claimed position, even when
    that claim lies ahead of now (claimed ~250 ms early, on its way)."""
    owed = replace(every_minute(), next_fire_ms=T0 + 4 * MIN, fire_count=3,
                   last_fire_pos=T0 + 3 * MIN)  # fmt: skip  # the 3 min fire is on its way
    patched = t.patch(owed, {"max_fires": 10}, T0 + 3 * MIN - 200)
    assert (patched.next_fire_ms, patched.status) == (T0 + 4 * MIN, "active")
    assert t.patch(owed, {"max_fires": 3}, T0 + 3 * MIN - 200).status == "completed"
    behind = replace(every_minute(), next_fire_ms=T0 + MIN, fire_count=0)  # overdue, unfired
    assert t.patch(behind, {"end_ms": T0 + 60 * MIN}, T0 + 10 * MIN + 1).next_fire_ms == (
        T0 + 11 * MIN
    )
    earlier = t.patch(every_minute(), {"start_ms": T0 - 30_000}, T0 + 1_000)
    assert earlier.next_fire_ms == T0 + 30_000  # the new series' next, before the old cursor
    assert t.patch(owed, {"end_ms": T0 + 3 * MIN + 1}, T0).status == "completed"


def test_a_completed_timer_given_more_fires_continues_from_now() -> None:
    done = replace(every_minute(max_fires=2), status="completed", next_fire_ms=None,
                   fire_count=2, last_fire_pos=T0 + 2 * MIN)  # fmt: skip
    again = t.patch(done, {"max_fires": 5}, T0 + 30 * MIN + 1)
    assert (again.status, again.next_fire_ms) == ("active", T0 + 31 * MIN)


def test_a_fired_one_shot_is_rearmed_only_by_a_new_schedule() -> None:
    fired = t.Timer(
        "acme",
        "tmr_1",
        AtSchedule(T0),
        T0 - MIN,
        "q",
        "null",
        fire_count=1,
        status="completed",
        next_fire_ms=None,
    )
    assert t.patch(fired, {"end_ms": T0 + MIN}, T0 + 1).status == "completed"
    rearmed = t.patch(fired, {"schedule": AtSchedule(T0 + MIN)}, T0 + 1)
    assert (rearmed.status, rearmed.next_fire_ms) == ("active", T0 + MIN)


def made(schedule: Schedule, **kw: int) -> t.Timer:
    return t.create(
        "acme", "tmr_1", schedule=schedule, target_queue_url="q", payload_json="null", now_ms=T0,
        **kw,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("schedule", "bounds", "cursor_after_reset"),
    [
        (AfterSchedule(30), {}, T0 + 5 * MIN + 30_000),  # now + seconds
        (EverySchedule(60), {}, T0 + 6 * MIN),  # now + period
        (EverySchedule(60), {"start_ms": T0 + 30_000}, T0 + 5 * MIN + 30_000),  # its series
        (CronSchedule("*/7 * * * *"), {}, T0 + 7 * MIN),  # the next occurrence after now
        (CronSchedule("5 10 * * *"), {}, T0 + 24 * 60 * MIN + 5 * MIN),  # 10:05 is now: not after
        (AtSchedule(T0 + 60 * MIN), {}, T0 + 60 * MIN),
    ],
)
def test_reset_restarts_the_schedule_from_now_as_if_just_created(
    schedule: Schedule, bounds: dict[str, int], cursor_after_reset: int
) -> None:
    fired = replace(made(schedule, **bounds), fire_count=3, status="completed", next_fire_ms=None)
    reset = t.reset(fired, T0 + 5 * MIN)
    assert (reset.status, reset.fire_count, reset.next_fire_ms) == ("active", 0, cursor_after_reset)
    assert (reset.anchor_ms, reset.updated_ms, reset.created_ms) == (T0 + 5 * MIN,) * 2 + (T0,)


def test_reset_of_a_paused_timer_counts_max_fires_again() -> None:
    paused = t.pause(replace(every_minute(max_fires=2), fire_count=1), T0 + MIN)
    reset = t.reset(paused, T0 + 90_000)
    assert (reset.status, reset.fire_count, reset.next_fire_ms) == ("active", 0, T0 + 150_000)


@pytest.mark.parametrize("at", [T0 + MIN, T0 + MIN - 1])
def test_reset_refuses_an_at_that_is_not_after_now(at: int) -> None:
    with pytest.raises(InvalidInput) as err:
        t.reset(made(AtSchedule(at)), T0 + MIN)
    assert [e.field for e in err.value.details] == ["schedule.at"]


def test_reset_refuses_a_plan_left_with_no_fire() -> None:
    ending = made(EverySchedule(60), end_ms=T0 + 150_000)
    with pytest.raises(InvalidInput) as err:
        t.reset(ending, T0 + 120_000)  # 10:03 is past end_at
    assert [e.field for e in err.value.details] == ["schedule"]


def test_read_only_fields_cannot_be_patched() -> None:
    with pytest.raises(ValueError):
        t.patch(every_minute(), {"status": "completed"}, T0)


def test_payload_limit_is_64_kib_serialized() -> None:
    assert t.serialize_payload("x" * (64 * 1024 - 2))
    with pytest.raises(PayloadTooLarge):
        t.serialize_payload("x" * (64 * 1024 - 1))
    assert t.serialize_payload({"a": [1, None]}) == '{"a":[1,null]}'

"""The trigger's pure decisions: what fires, how a timer advances, how late a fire was."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.clock import T0
from timers.core import timer as timers
from timers.core.schedule import AtSchedule, EverySchedule, Misfire
from timers.firing import MISFIRE_GRACE_MS, advanced, callback_body, decide, lag_bucket, triage
from timers.redis_index import member


def _timer(**fields: Any) -> timers.Timer:
    fields.setdefault("payload_json", "null")
    return timers.create("acme", "tmr_x", target_queue_url="q", now_ms=T0, **fields)


@pytest.mark.parametrize(
    ("lag", "bucket"),
    [(0, "on_time"), (100, "on_time"), (101, "le_200ms"), (200, "le_200ms"), (600, "le_600ms"),
     (601, "le_1s"), (1_000, "le_1s"), (2_000, "le_2s"), (2_001, "gt_2s"), (60_000, "gt_2s")],
)  # fmt: skip
def test_lag_bucket(lag: int, bucket: str) -> None:
    assert lag_bucket(lag) == bucket


def test_decide_never_fires_an_occurrence_in_the_future() -> None:
    timer = _timer(schedule=EverySchedule(1))
    with pytest.raises(ValueError, match="never fire early"):
        decide(timer, T0 + 1_000, T0 + 999)
    assert decide(timer, T0 + 1_000, T0 + 1_000).fire_ms == T0 + 1_000


@settings(max_examples=200, deadline=None)
@given(
    period_s=st.integers(1, 3_600),
    behind_ms=st.integers(0, 10 * 86_400_000),
    misfire=st.sampled_from(["fire_once", "fire_all", "skip"]),
)
def test_decide_fires_a_due_occurrence_and_moves_forward(
    period_s: int, behind_ms: int, misfire: Misfire
) -> None:
    timer = _timer(schedule=EverySchedule(period_s), misfire=misfire)
    cursor = T0 + period_s * 1_000
    now = cursor + behind_ms
    decision = decide(timer, cursor, now)
    if decision.fire_ms is not None:
        assert cursor <= decision.fire_ms <= now  # never early, never before the cursor
        assert decision.next_cursor_ms is not None and decision.next_cursor_ms > decision.fire_ms
    else:
        assert misfire == "skip" and decision.next_cursor_ms is not None
        assert decision.next_cursor_ms > now
    if behind_ms <= MISFIRE_GRACE_MS or misfire == "fire_all":
        assert decision.fire_ms == cursor  # merely late, or every missed one fires in turn


def test_advanced_completes_one_shots_and_timers_out_of_fires() -> None:
    one_shot = _timer(schedule=AtSchedule(T0 + 5_000))
    assert advanced(one_shot, T0 + 5_000, T0 + 5_000).status == "completed"
    capped = _timer(schedule=EverySchedule(1), max_fires=2)
    first = advanced(capped, T0 + 1_000, T0 + 1_000)
    assert (first.status, first.next_fire_ms, first.fire_count) == ("active", T0 + 2_000, 1)
    second = advanced(first, T0 + 2_000, T0 + 2_000)
    assert (second.status, second.next_fire_ms, second.fire_count) == ("completed", None, 2)
    ending = _timer(schedule=EverySchedule(1), end_ms=T0 + 1_500)
    assert advanced(ending, T0 + 1_000, T0 + 1_000).status == "completed"
    skipped = advanced(_timer(schedule=EverySchedule(60)), None, T0 + 90_000)
    assert (skipped.next_fire_ms, skipped.fire_count) == (T0 + 120_000, 0)


def test_callback_body_embeds_the_stored_payload_verbatim() -> None:
    text = '{"b":1,"a":[1.50,"ü"]}'  # key order and number spelling as the client sent them
    timer = _timer(schedule=AtSchedule(T0 + 1_000), payload_json=text, name=None)
    body = callback_body(timer, T0 + 1_000, T0 + 1_041)
    assert body.endswith(f',"payload":{text}}}')
    assert json.loads(body) == {
        "fire_id": f"tmr_x:{T0 + 1_000}",
        "timer_id": "tmr_x",
        "tenant": "acme",
        "name": None,
        "scheduled_at": "2026-11-21T10:00:01.000Z",
        "fired_at": "2026-11-21T10:00:01.041Z",
        "payload": {"b": 1, "a": [1.5, "ü"]},
    }


def test_triage_drops_what_changed_and_fires_what_is_current() -> None:
    current = _timer(schedule=EverySchedule(1))  # cursor T0 + 1 s
    paused = timers.pause(_timer(schedule=EverySchedule(1)), T0)
    now = T0 + 2_000
    members = [
        member("acme", "tmr_x", T0 + 1_000),  # current
        member("acme", "tmr_gone", T0 + 1_000),  # deleted
        member("acme", "tmr_x", T0 + 500),  # an old occurrence: rescheduled / advanced
    ]
    batch = triage(members, {("acme", "tmr_x"): current}, now, lookahead_ms=120_000)
    assert [f.member for f in batch.to_fire] == [members[0]]
    assert batch.stale == members[1:]
    assert batch.reindex == [("acme", "tmr_x", T0 + 1_000)]  # the stale copy's live cursor
    paused_batch = triage(members[:1], {("acme", "tmr_x"): paused}, now, lookahead_ms=120_000)
    assert (paused_batch.stale, paused_batch.to_fire, paused_batch.reindex) == (members[:1], [], [])

"""The failed-fires rules without I/O: the sort key orders by time, a window is a key range
that includes both ends, a redelivered message carries what it should, and the view."""

from __future__ import annotations

import pytest

from timers.core.failures import (
    KEY_MAX_MS,
    REDELIVERED,
    FailedFire,
    failed_fire_view,
    key_range,
    redelivered_at,
    sort_key,
)
from timers.core.webhook_attempts import DeliveryState

T = 1_795_255_202_000  # 2026-11-21T10:00:02.000Z


def test_sort_keys_order_by_failed_at_then_fire() -> None:
    keys = [sort_key(999, "b:1"), sort_key(T, "a:2"), sort_key(T, "a:1"), sort_key(T + 1, "0:0")]
    assert sorted(keys) == [keys[0], keys[2], keys[1], keys[3]]
    assert sort_key(T, "tmr_a:1") == f"{T}#tmr_a:1" and len(sort_key(5, "x")) == 13 + 2


@pytest.mark.parametrize(
    ("since", "until", "inside", "outside"),
    [
        (T, T, [T], [T - 1, T + 1]),  # both ends included, every fire of the last ms
        (None, T, [0, T], [T + 1]),
        (T, None, [T, KEY_MAX_MS], [T - 1]),
        (-86_400_000, 5, [0, 5], [6]),  # before 1970: from 0
        (T, 10**15, [T, KEY_MAX_MS], [T - 1]),  # past 2286: to the largest key
    ],
)
def test_a_window_is_a_key_range_with_both_ends(
    since: int | None, until: int | None, inside: list[int], outside: list[int]
) -> None:
    low, high = key_range(since, until)
    for ms in inside:
        assert low <= sort_key(ms, "tmr_zz~:9") <= high, ms
    for ms in outside:
        assert not low <= sort_key(ms, "tmr_a:1") <= high, ms


RECORD = FailedFire(
    tenant="acme", fire_id="tmr_a:1795255201000", timer_id="tmr_a", reason="http 400",
    last_status=400, attempts=1, failed_ms=T, body="{}",
    attributes={"fire_id": "tmr_a:1795255201000", "tenant": "acme", "claim": "7/1 tmr_a@000",
                "target": "{}", "deferrals": "4"},
)  # fmt: skip


def test_a_redelivered_message_starts_over_its_deferrals_and_carries_its_stamp() -> None:
    attributes = RECORD.redelivery_attributes(T + 5)
    assert attributes == {
        "fire_id": "tmr_a:1795255201000", "tenant": "acme", "claim": "7/1 tmr_a@000",
        "target": "{}", REDELIVERED: str(T + 5),
    }  # fmt: skip
    assert redelivered_at(attributes) == T + 5 and redelivered_at(RECORD.attributes) is None


def test_a_reopened_record_keeps_its_attempts_and_counts_its_budget_from_the_redelivery() -> None:
    failed = DeliveryState(41, 10, 20, 503, None, failed="gave up", failed_ms=30)
    assert failed.reopened(40) == DeliveryState(41, 40, 20, 503, base_attempts=41)
    assert not failed.reopened(40).settled
    assert failed.redelivered_since(31) and not failed.redelivered_since(30)
    assert not failed.redelivered_since(None)
    assert not DeliveryState(1, delivered_ms=5).redelivered_since(10)


def test_the_view_has_the_due_time_from_the_fire_id() -> None:
    assert failed_fire_view(RECORD, None) == {
        "fire_id": "tmr_a:1795255201000", "timer_id": "tmr_a", "name": None,
        "due_at": "2026-11-21T10:00:01.000Z", "failed_at": "2026-11-21T10:00:02.000Z",
        "reason": "http 400", "last_status": 400, "attempts": 1, "redelivered_at": None,
    }  # fmt: skip

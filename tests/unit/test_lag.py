"""Accuracy levels (timers.core.lag): each boundary of each level, with and without a flexible
window, and the usage counts that put every enqueued fire in exactly one level."""

from __future__ import annotations

import pytest

from timers.core.lag import LAG_LEVELS, lag_level, lateness_ms
from timers.tenancy.usage import COUNTS, fire_counts

T = 1_793_000_000_000  # a due time in 2026-10


@pytest.mark.parametrize(
    ("lag_ms", "level"),
    [
        (-5, "ontime"),  # enqueued before due: never happens, counted as on time
        (0, "ontime"),
        (1, "1-200ms"),
        (200, "1-200ms"),
        (201, "200-600ms"),
        (600, "200-600ms"),
        (601, "600-1000ms"),
        (1000, "600-1000ms"),
        (1001, "1000-2000ms"),
        (2000, "1000-2000ms"),
        (2001, "over_2000ms"),
        (86_400_000, "over_2000ms"),
    ],
)
def test_every_boundary_of_every_level(lag_ms: int, level: str) -> None:
    assert lag_level(lag_ms) == level
    assert lag_level(lag_ms, 0) == level


@pytest.mark.parametrize(
    ("lag_ms", "window_ms", "lateness", "level"),
    [
        (0, 60_000, 0, "ontime"),  # at the nominal due time, the window's start
        (30_000, 60_000, 0, "ontime"),  # within the window
        (60_000, 60_000, 0, "ontime"),  # at the window's end
        (60_001, 60_000, 1, "1-200ms"),  # 1 ms past it
        (60_200, 60_000, 200, "1-200ms"),
        (60_201, 60_000, 201, "200-600ms"),
        (62_000, 60_000, 2_000, "1000-2000ms"),
        (62_001, 60_000, 2_001, "over_2000ms"),
        (-1, 60_000, 0, "ontime"),
    ],
)
def test_a_window_measures_lateness_from_its_end(
    lag_ms: int, window_ms: int, lateness: int, level: str
) -> None:
    assert lateness_ms(lag_ms, window_ms) == lateness
    assert lag_level(lag_ms, window_ms) == level


def test_the_levels_are_the_contracts_names_in_order() -> None:
    assert LAG_LEVELS == ("ontime", "1-200ms", "200-600ms", "600-1000ms", "1000-2000ms",
                          "over_2000ms")  # fmt: skip


def test_every_enqueued_fire_counts_in_exactly_one_level() -> None:
    lags = [0, 0, 1, 150, 200, 201, 600, 601, 1000, 1001, 2000, 2001, 5000]
    rows = [("acme", T, T + lag, "d", False, 0) for lag in lags]
    rows += [
        ("acme", T, T + 3_000, "f", False, 0),
        ("acme", T, T + 9, "k", True, 0),
    ]  # failed, skip
    rows += [("acme", T, T + 60_000, "d", False, 60_000)]  # a window's last instant: on time
    rows += [("acme", T, T + 60_300, "d", False, 60_000)]  # 300 ms past its window
    ((key, counts),) = fire_counts(rows).items()
    assert key == ("acme", "2026-10")
    assert set(counts) == set(COUNTS)
    levels = {level: counts[level] for level in LAG_LEVELS}
    assert levels == {"ontime": 3, "1-200ms": 3, "200-600ms": 3, "600-1000ms": 2,
                      "1000-2000ms": 2, "over_2000ms": 2}  # fmt: skip
    assert sum(levels.values()) == counts["enqueued"] == 15
    assert (counts["failed"], counts["active"]) == (1, -1)
    assert counts["late_1s"] == 4  # 1001, 2000, 2001, 5000: from a window's end, as the levels


def test_fires_recorded_in_two_months_count_in_each() -> None:
    rows = [("acme", T, T, "d", False, 0), ("acme", T, T + 10 * 86_400_000, "d", False, 0)]
    counted = fire_counts(rows)
    assert set(counted) == {("acme", "2026-10"), ("acme", "2026-11")}
    late = counted[("acme", "2026-11")]
    assert (late["enqueued"], late["over_2000ms"], late["ontime"]) == (1, 1, 0)

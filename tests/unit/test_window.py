"""The flexible window's pure rules (timers.core.window): when a windowed fire is sent, and
which fires meet. Invariant 1 in its windowed form: never before the due time, never after the
window's end."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from timers.core.window import (
    ALIGNMENTS_MS,
    WINDOW_MAX_MS,
    aligned,
    grain_for,
    phase_of,
    send_at,
)

T0 = 1_795_255_200_000


@pytest.mark.parametrize(
    ("window_ms", "grain"),
    [(0, 0), (999, 0), (1_000, 500), (9_999, 1_000), (10_000, 5_000), (60_000, 30_000),
     (119_999, 30_000), (120_000, 60_000), (600_000, 300_000), (WINDOW_MAX_MS, 300_000)],
)  # fmt: skip
def test_a_window_aligns_to_the_largest_grain_within_its_half(window_ms: int, grain: int) -> None:
    """Half the window for the alignment, the other half left to drain a crowded instant."""
    assert grain_for(window_ms) == grain
    assert grain * 2 <= window_ms


@given(
    due=st.integers(T0, T0 + 86_400_000),
    window_ms=st.integers(0, WINDOW_MAX_MS),
    grain_ms=st.sampled_from((0, *ALIGNMENTS_MS)),
    partition=st.integers(0, 4_095),
)
def test_a_fire_is_sent_within_its_window_never_before_its_due_time(
    due: int, window_ms: int, grain_ms: int, partition: int
) -> None:
    """Whatever grain the timer was created with and whatever its window is now."""
    sent = send_at(due, window_ms, grain_ms, partition)
    assert due <= sent <= due + window_ms
    if window_ms == 0:
        assert sent == due


@given(
    dues=st.lists(st.integers(0, 29_999), min_size=2, max_size=20),
    partition=st.integers(0, 4_095),
)
def test_the_fires_of_a_partition_due_within_a_grain_meet_at_one_instant(
    dues: list[int], partition: int
) -> None:
    grain = 30_000
    start = aligned(T0, grain, partition)  # an aligned instant: the period after it
    instants = {send_at(start + 1 + d, 60_000, grain, partition) for d in dues}
    assert instants == {start + grain}


def test_partitions_spread_their_instants_over_the_period() -> None:
    phases = {phase_of(p, 60_000) for p in range(4_096)}
    assert len(phases) == 60_000 // 500  # every half second of the minute is someone's
    assert phase_of(7, 500) == 0 and all(0 <= p < 60_000 and p % 500 == 0 for p in phases)


def test_a_window_narrowed_after_creation_aligns_to_its_own_grain() -> None:
    """A timer created with 60 s (grain 30 s) whose window becomes 4 s: its fires align to
    1 s (the new window's grain), still within 4 s of their due time."""
    due = T0 + 12_345
    assert send_at(due, 4_000, 30_000, 7) == aligned(due, 1_000, 7) < due + 4_000
    assert send_at(due, 0, 30_000, 7) == due  # on the dot again

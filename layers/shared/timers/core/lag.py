"""Accuracy levels: how late a fire was enqueued, in the levels usage counts it by.

A fire's lateness L is, in whole ms, its enqueue time minus its due time - for a timer with a
flexible window of W ms, minus the end of its window (due + W), and 0 within it; never below
0 (a fire is never early). Its level:

    ontime        L = 0
    1-200ms       1 <= L <= 200
    200-600ms     200 < L <= 600
    600-1000ms    600 < L <= 1000
    1000-2000ms   1000 < L <= 2000
    over_2000ms   L > 2000

No I/O here: timers.tenancy.usage counts each enqueued fire in its level, and the trigger's
metrics count a run's sends by the same levels.
"""

from __future__ import annotations

LAG_LEVELS = ("ontime", "1-200ms", "200-600ms", "600-1000ms", "1000-2000ms", "over_2000ms")
"""The levels, earliest first: the names the usage answer's ``lag`` carries."""
UPPER_MS = (0, 200, 600, 1000, 2000)
"""Each level's largest lateness (inclusive); the last level has none."""


def lateness_ms(lag_ms: int, window_ms: int = 0) -> int:
    """L of a fire enqueued ``lag_ms`` after its (nominal) due time, its timer's window
    ``window_ms`` long: measured from the window's end, 0 within it."""
    return max(0, lag_ms - max(0, window_ms))


def lag_level(lag_ms: int, window_ms: int = 0) -> str:
    """The level of a fire enqueued ``lag_ms`` after its due time (its timer's window
    ``window_ms``; 0: none)."""
    late = lateness_ms(lag_ms, window_ms)
    for level, upper in zip(LAG_LEVELS, UPPER_MS, strict=False):
        if late <= upper:
            return level
    return LAG_LEVELS[-1]

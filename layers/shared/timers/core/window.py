"""The flexible window: a fire of a timer with a window of W ms may land anywhere in
[due, due + W], and the service picks the moment so that fires meet.

Fires of one *grain* A are sent at aligned instants ``phase + k * A`` - the first at or after
their due time - so the fires of a claim partition due within one A meet in one trigger run,
one claim item and SQS batches of ten. A is the largest of ALIGNMENTS_MS no more than half the
window: a fire lands less than A after its due time, which leaves at least the other half of
its window to drain an instant's crowd before the window ends. The phase, fixed per partition,
spreads partitions over the period instead of stacking every tenant on the same instants.

A timer's grain is fixed when it is created (its fire log entries' homes depend on it, and
must not move while any revision of the timer may claim them); a window changed later moves
only the send instants (aligned to the new window's grain when the created one does not fit).
No I/O; times are epoch ms.
"""

from __future__ import annotations

import zlib

WINDOW_MAX_MS = 900_000
"""The contract's largest window: 900 s."""
ALIGNMENTS_MS = (500, 1_000, 5_000, 10_000, 30_000, 60_000, 300_000)
"""The grains a window may align fires to (a window of W aligns to the largest <= W / 2)."""
PHASE_STEP_MS = 500


def grain_for(window_ms: int) -> int:
    """The alignment of a window: the largest of ALIGNMENTS_MS at most half of it (0: none,
    for a window under a second - on the dot)."""
    fitting = [a for a in ALIGNMENTS_MS if a <= window_ms // 2]
    return max(fitting, default=0)


def phase_of(partition: int, grain_ms: int) -> int:
    """Where in each period of ``grain_ms`` a partition's aligned instants fall."""
    if grain_ms <= PHASE_STEP_MS:
        return 0
    return zlib.crc32(str(partition).encode()) % (grain_ms // PHASE_STEP_MS) * PHASE_STEP_MS


def aligned(due_ms: int, grain_ms: int, partition: int) -> int:
    """The first aligned instant at or after ``due_ms`` (``due_ms`` itself without a grain)."""
    if grain_ms <= 0:
        return due_ms
    phase = phase_of(partition, grain_ms)
    periods = -(-(due_ms - phase) // grain_ms)  # ceiling division
    return phase + periods * grain_ms


def send_at(due_ms: int, window_ms: int, grain_ms: int, partition: int) -> int:
    """When a fire due at ``due_ms`` is sent: at its grain's aligned instant if that grain fits
    the window as it is now (less than half of it), else at the aligned instant of the window's
    own grain; on the dot without a window. Never before ``due_ms``, always before
    ``due_ms + window_ms``."""
    if window_ms <= 0:
        return due_ms
    grain = grain_ms if 0 < grain_ms <= window_ms // 2 else grain_for(window_ms)
    return aligned(due_ms, grain, partition)

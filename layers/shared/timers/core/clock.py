"""The reference clock (Redis ``TIME``) a fire is never sent before: the trigger's and run
now's ("Never early" in docs/fire-path.md)."""

from __future__ import annotations

from collections.abc import Callable

MAX_CLOCK_OFFSET_MS = 2_000  # a host clock further off than this is broken: refuse
MAX_CLOCK_ERROR_MS = 100  # an offset measured by a round trip longer than twice this: refuse
CLOCK_RESYNC_MS = 5_000


class ClockSync:
    """The reference time, kept between measures by the host's monotonic clock: the offset is
    ``reference - midpoint`` of two local reads around one reference read, its error half that
    round trip; the wall clock is only checked against the reference at each measure."""

    def __init__(
        self,
        clock: Callable[[], int],
        reference: Callable[[], int],
        monotonic: Callable[[], int] | None = None,
    ) -> None:
        self._wall, self._clock, self._reference = clock, monotonic or clock, reference
        self.offset: int | None = None
        self.wall_offset: int | None = None
        self.error = 0
        self.measured_at = 0

    def measure(self) -> None:
        wall, before = self._wall(), self._clock()
        ref = self._reference()
        after = self._clock()
        self.offset = ref - (before + after) // 2
        self.wall_offset = ref - (wall + (after - before) // 2)
        self.error = (after - before + 1) // 2 + 1
        self.measured_at = after

    @property
    def trusted(self) -> bool:
        return (
            self.offset is not None
            and self.wall_offset is not None
            and abs(self.wall_offset) <= MAX_CLOCK_OFFSET_MS
            and self.error <= MAX_CLOCK_ERROR_MS
        )

    def now(self) -> int:
        return self._clock() + (self.offset or 0)

    def lower(self) -> int:
        """A time the reference has certainly reached."""
        return self.now() - self.error

    def stale(self) -> bool:
        return self._clock() - self.measured_at > CLOCK_RESYNC_MS

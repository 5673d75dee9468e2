"""The injected clock of the tests and the in-process benchmarks."""

from __future__ import annotations

from dataclasses import dataclass

T0 = 1_795_255_200_000  # 2026-11-21T10:00:00.000Z


@dataclass
class FakeClock:
    """Epoch ms that only moves when its owner moves it."""

    now: int = T0

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> int:
        self.now += ms
        return self.now

    def sleep(self, seconds: float) -> None:
        """A sleeper for the code under test: waiting moves this clock (at least 1 ms)."""
        self.advance(max(1, round(seconds * 1000)))

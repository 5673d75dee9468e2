"""The injected clock of the tests and the in-process benchmarks."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from timers.engine.fanout import Fanout
    from timers.runtime import Wiring

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


def injected_clock_fanout(
    wiring: Wiring, invoke: Callable[..., Any], clock: FakeClock, sleep: Callable[[float], None]
) -> Fanout:
    """The fan-out of a world on an injected clock. A poll takes no time there, so it waits for
    each shard's peek (``shard_wait_s=None``): a shard's real 0.1 s wait would make its fires
    late on the injected clock by however long the machine took to answer."""
    from timers.engine.fanout import Fanout
    from timers.runtime import fanout_deps

    return Fanout(fanout_deps(wiring, invoke, clock, sleep, shard_wait_s=None))

"""Fan-out: tick on every second boundary and async-invoke the trigger for each bucket with work.

EventBridge starts a fan-out every minute; each run ticks for a little over a minute, so the
runs overlap and a late start leaves no gap. Exactly one run ticks at a time:

- The holder of a ``Lock`` (owner token, ``LOCK_TTL_MS``) ticks; it renews on every tick and
  releases when its window ends. Every other run tries to acquire on every tick, so it takes
  over at the next boundary after a release, or after the TTL when the holder died.
- The holder writes the boundary it ticks to a marker key before ticking; a run that has just
  acquired the lock skips boundaries up to the marker, so the boundary at which the previous
  holder released is not ticked twice.

The lock only avoids duplicate invocations; correctness never rests on it. Two triggers on one
bucket lease disjoint members, a late tick covers everything due by its time (``score <= now``),
so a skipped or doubled tick costs latency or an idle invocation, never a fire.

Per tick: one pipelined ``due_counts`` over all buckets, then one async trigger invocation per
``PER_TRIGGER`` due members of each bucket with work (``ceil(count / PER_TRIGGER)``), invoked
from a small thread pool so a busy second does not overrun the tick.

The loop is a generator that yields the instant it wants to wake at, so ``run_fanout`` sleeps
with the injected sleeper while tests can interleave several runs on one fake clock.
"""

from __future__ import annotations

import json
import logging
import math
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from timers.firing import BATCH_LIMIT

logger = logging.getLogger(__name__)

TICK_MS = 1_000
# A live holder renews every TICK_MS and a tick (one Redis round trip plus parallel async
# invokes with short client timeouts) takes well under a second, so the lock never lapses under
# a live holder; a dead holder's lock expires within two ticks and the next boundary is ticked
# by another run. A lapse under load only hands over the ticking (the marker prevents doubles).
LOCK_TTL_MS = 2_000
LOCK_KEY = "tq:{fanout}:lock"
MARKER_KEY = "tq:{fanout}:ticked"
MARKER_TTL_MS = 10 * 60_000  # outlives any run; it only has to bridge a hand-over
# One trigger invocation per this many due members of a bucket: what a trigger leases per round.
PER_TRIGGER = BATCH_LIMIT
# Concurrent async invokes per tick: an Event invoke returns in ~10-50 ms, so 16 workers issue
# several hundred a second.
INVOKE_WORKERS = 16
# A run ticks for at most this long: a minute plus slack, so the next minute's run (EventBridge
# may start it a few seconds late) overlaps it instead of leaving a gap.
MAX_RUN_MS = 70_000
# Kept free before the Lambda timeout: finish the last tick, release the lock, return.
STOP_MARGIN_MS = 5_000


class IndexPort(Protocol):
    """The part of ``RedisIndex`` the fan-out uses."""

    bucket_count: int

    def due_counts(self, buckets: Sequence[int], now_ms: int) -> dict[int, int]: ...


class LockPort(Protocol):
    def acquire(self, token: str) -> bool: ...
    def renew(self, token: str) -> bool: ...
    def release(self, token: str) -> bool: ...


class MarkerPort(Protocol):
    """The Redis commands the tick marker uses."""

    def get(self, name: str) -> Any: ...
    def set(self, name: str, value: str, *, px: int | None = None) -> Any: ...


@dataclass(frozen=True)
class FanoutDeps:
    index: IndexPort
    lock: LockPort
    marker: MarkerPort
    invoke: Callable[..., Any]  # boto3 Lambda client's ``invoke`` (or a test recorder's)
    trigger_function: str
    clock: Callable[[], int]  # epoch ms
    sleep: Callable[[float], None]  # seconds
    per_trigger: int = PER_TRIGGER
    invoke_workers: int = INVOKE_WORKERS
    new_token: Callable[[], str] = field(default=lambda: uuid.uuid4().hex)


@dataclass
class FanoutReport:
    ticked: list[int] = field(default_factory=list)  # boundaries this run ticked
    skipped: int = 0  # boundaries another run held the lock for
    due: int = 0  # due members seen, summed over ticks
    invocations: int = 0
    failed_invocations: int = 0
    errors: int = 0  # ticks that failed on Redis

    @property
    def ticks(self) -> int:
        return len(self.ticked)

    def summary(self) -> dict[str, int]:
        return {
            "ticks": self.ticks,
            "skipped": self.skipped,
            "due": self.due,
            "invocations": self.invocations,
            "failed_invocations": self.failed_invocations,
            "errors": self.errors,
        }


# ---------------------------------------------------------------- pure decisions


def next_boundary(now_ms: int, after_ms: int | None = None) -> int:
    """The first second boundary at or after now, and strictly after ``after_ms``."""
    boundary = -(-now_ms // TICK_MS) * TICK_MS
    if after_ms is not None and boundary <= after_ms:
        boundary = (after_ms // TICK_MS + 1) * TICK_MS
    return boundary


def slices(counts: Mapping[int, int], per_trigger: int) -> list[int]:
    """Buckets to invoke the trigger for, one entry per slice (ceil(count / per_trigger))."""
    return [
        bucket
        for bucket, count in sorted(counts.items())
        for _ in range(math.ceil(count / per_trigger))
    ]


def run_deadline(start_ms: int, remaining_ms: int) -> int:
    """When a run stops ticking: after MAX_RUN_MS, or STOP_MARGIN_MS before the Lambda timeout."""
    return start_ms + max(0, min(MAX_RUN_MS, remaining_ms - STOP_MARGIN_MS))


# ---------------------------------------------------------------- the run


class Fanout:
    """One fan-out run: the lock it may hold, and its ticks."""

    def __init__(self, deps: FanoutDeps) -> None:
        self.deps = deps
        self.token = deps.new_token()
        self.report = FanoutReport()
        self._held = False
        self._floor_ms = -1  # boundaries at or below this were ticked by an earlier holder
        self._buckets = list(range(deps.index.bucket_count))

    def steps(self, start_ms: int, deadline_ms: int) -> Iterator[int]:
        """Yield each boundary to wake at (the driver waits until then), then tick it."""
        boundary = next_boundary(start_ms)
        while boundary <= deadline_ms:
            yield boundary
            try:
                self.at_boundary(boundary)
            except Exception:  # a Redis blip costs this tick, not the rest of the minute
                logger.exception("fanout tick failed", extra={"tick_ms": boundary})
                self.report.errors += 1
            # From the clock: a tick that overran a boundary skips it (the next covers its work).
            boundary = next_boundary(self.deps.clock(), boundary)

    def at_boundary(self, tick_ms: int) -> None:
        """Tick ``tick_ms`` if this run holds the lock and no earlier holder ticked it."""
        if not self._hold():
            self.report.skipped += 1
            return
        if tick_ms <= self._floor_ms:
            return
        self.deps.marker.set(MARKER_KEY, str(tick_ms), px=MARKER_TTL_MS)
        self._floor_ms = tick_ms
        self.report.ticked.append(tick_ms)
        counts = self.deps.index.due_counts(self._buckets, tick_ms)  # one round trip
        self.report.due += sum(counts.values())
        self._invoke(slices(counts, self.deps.per_trigger), tick_ms)

    def release(self) -> None:
        if self._held:
            self.deps.lock.release(self.token)
            self._held = False

    def _hold(self) -> bool:
        """Renew the lock we hold, or try to take it; on taking it, read the marker."""
        if self._held:
            self._held = self.deps.lock.renew(self.token)
        if not self._held and self.deps.lock.acquire(self.token):
            self._held = True
            ticked = self.deps.marker.get(MARKER_KEY)
            self._floor_ms = int(ticked) if ticked is not None else -1
        return self._held

    def _invoke(self, buckets: list[int], tick_ms: int) -> None:
        if not buckets:
            return
        workers = max(1, min(self.deps.invoke_workers, len(buckets)))
        with ThreadPoolExecutor(max_workers=workers) as pool:
            sent = list(pool.map(lambda b: self._invoke_one(b, tick_ms), buckets))
        self.report.invocations += sum(sent)
        self.report.failed_invocations += len(sent) - sum(sent)

    def _invoke_one(self, bucket: int, tick_ms: int) -> bool:
        payload = json.dumps({"bucket": bucket, "tick_ms": tick_ms}).encode()
        try:
            self.deps.invoke(
                FunctionName=self.deps.trigger_function, InvocationType="Event", Payload=payload
            )
        except Exception:  # throttled or failed: the work stays due and the next tick retries
            logger.exception("trigger invoke failed", extra={"bucket": bucket, "tick_ms": tick_ms})
            return False
        return True


def wait_until(clock: Callable[[], int], sleep: Callable[[float], None], at_ms: int) -> None:
    while (left := at_ms - clock()) > 0:
        sleep(left / 1000)


def run_fanout(deps: FanoutDeps, start_ms: int, deadline_ms: int) -> FanoutReport:
    """Tick every second boundary from ``start_ms`` to ``deadline_ms`` while holding the lock."""
    fanout = Fanout(deps)
    try:
        for wake_ms in fanout.steps(start_ms, deadline_ms):
            wait_until(deps.clock, deps.sleep, wake_ms)
    finally:
        fanout.release()
    return fanout.report

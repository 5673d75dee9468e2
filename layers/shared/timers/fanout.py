"""Fan-out: start each bucket's trigger run shortly before its earliest member falls due.

EventBridge starts a fan-out every minute; each run goes on for a little over a minute, so
runs overlap and a late start leaves no gap. One run at a time holds an owner-token ``Lock``
and dispatches; the others wait for it to lapse or be released.

Every POLL_MS the holder reads the hints (bucket -> lower bound of its earliest due member,
lowered by every adder) due within LEAD_MS. For each such bucket, smallest backlog first, it
wants ``ceil(backlog / PER_TRIGGER)`` runs (at most MAX_PARALLEL): it removes the hint if
nobody lowered it meanwhile, then starts each run whose marker it can set (``SET NX``,
START_TTL_MS until the run extends it). A run re-hints its bucket when it ends, after clearing
its marker, so every member has a hint or a run that will see it; every SWEEP_MS a backstop
sweep re-hints every bucket from Redis itself (a lost invocation, a killed run).

A bucket whose runs are likely cold - the fan-out started none for COLD_AFTER_MS, so Lambda
may have retired the sandboxes - is started earlier, by the trigger's measured cold start
(invoke to handler; each cold trigger folds its own into a decaying peak in Redis). A run that
comes up more than the trigger's ARM_MS ahead leases nothing and ends, re-hinting its bucket:
the next poll starts it again, now warm, LEAD_MS ahead. So an estimate too high costs an
invocation, one too low costs lag; never-early is the trigger's, whenever it starts.

Correctness never rests on the lock or the markers: runs on one bucket lease disjoint members,
and a run covers everything leasable when it looks. They only avoid idle invocations.

The loop is a generator that yields the instant it wants to wake at, so ``run_fanout`` sleeps
with the injected sleeper while tests interleave runs on one fake clock.
"""

from __future__ import annotations

import json
import logging
import math
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

logger = logging.getLogger(__name__)

POLL_MS = 25
LEAD_MS = 200
"""A run is started this long before its bucket's earliest due member: an async invoke and a
warm start (~20-50 ms in AWS), a lease and a claim, with room to spare. The trigger then waits
for the due instant itself."""
SWEEP_MS = 1_000
PER_TRIGGER = 250
"""Backlog per concurrent run of one bucket: what a run sends in well under a second."""
MAX_PARALLEL = 8
START_TTL_MS = 5_000
"""A started run's marker lives this long until the run extends it to its own deadline: an
invocation that never starts frees its bucket after this."""
COLD_AFTER_MS = 60_000
"""A bucket with no run started for this long counts as cold. Lambda retires idle sandboxes
after minutes (undocumented; ~5-15 seen): counting warm sandboxes as cold costs one extra
short invocation, the reverse a cold start's lag, so this errs low."""
MAX_COLD_START_MS = 6_000
"""Samples, estimates and the cold lead are clamped to 0..this, so one pathological start does
not make sparse buckets' runs start ever earlier. On AWS the estimate stays near 1-2 s and this
never binds; the local stack's sandboxes took 4.9-5.9 s on a 2-core machine at load 6."""
COLD_HEADROOM = 2
"""A cold bucket's run is started this many estimates early: cold starts vary about twofold
(0.47-1.07 s in one local run), and an estimate too high costs an invocation, one too low a
late fire."""
DEFAULT_COLD_START_MS = MAX_COLD_START_MS // COLD_HEADROOM
"""Until a cold trigger has measured one, the longest lead: a cold Python trigger on AWS is
~400-900 ms with its imports, a local sandbox 0.5-6 s on a 2-core machine."""
RAN_WRITE_MS = 10_000
"""The fan-out records a bucket's run in Redis at most this often (its own copy every time): a
takeover then sees it up to this much older, which only errs towards cold."""
COLD_DECAY = 0.75
"""The estimate is a decaying peak: a slower cold start raises it at once, faster ones lower
it by a quarter of the gap each (an estimate too high is cheap, one too low is lag)."""
LOCK_KEY = "tq:{fanout}:lock"
LOCK_TTL_MS = 2_000
LOCK_RENEW_MS = 500
INVOKE_WORKERS = 16
MAX_RUN_MS = 70_000
"""A minute plus slack: the next minute's run (EventBridge may start it a few seconds late)
overlaps this one instead of leaving a gap."""
STOP_MARGIN_MS = 5_000


class DispatchIndex(Protocol):
    """The part of ``RedisIndex`` the fan-out uses."""

    bucket_count: int

    def hints_until(self, until_ms: int, limit: int = 10_000) -> list[tuple[int, int]]: ...
    def backlog(self, buckets: Sequence[int], until_ms: int, now_ms: int) -> dict[int, int]: ...
    def take_hint(self, bucket: int, hint_ms: int) -> bool: ...
    def rehint(self, bucket: int) -> int | None: ...
    def sweep(self) -> dict[int, int]: ...
    def start_run(self, bucket: int, slot: int, token: str, ttl_ms: int) -> bool: ...
    def end_run(self, bucket: int, slot: int, token: str) -> bool: ...


class WarmthPort(Protocol):
    """``timers.adapters.warmth.WarmthStore``: when buckets last ran, the cold-start estimate."""

    def cold_start_ms(self) -> int | None: ...
    def last_runs(self) -> dict[int, int]: ...
    def ran(self, buckets: Sequence[int], at_ms: int) -> None: ...


class LockPort(Protocol):
    def acquire(self, token: str) -> bool: ...
    def renew(self, token: str) -> bool: ...
    def release(self, token: str) -> bool: ...


@dataclass(frozen=True)
class FanoutDeps:
    index: DispatchIndex
    lock: LockPort
    invoke: Callable[..., Any]  # boto3 Lambda client's ``invoke`` (or a test recorder's)
    trigger_function: str
    clock: Callable[[], int]  # epoch ms
    sleep: Callable[[float], None]  # seconds
    new_token: Callable[[], str] = field(default=lambda: uuid.uuid4().hex[:12])
    warmth: WarmthPort | None = None  # None: every bucket counts as warm (no cold lead)


@dataclass
class FanoutReport:
    polls: int = 0
    sweeps: int = 0
    skipped: int = 0  # polls while another run held the lock
    invocations: int = 0
    cold_invocations: int = 0  # of those, runs started early because the bucket was cold
    failed_invocations: int = 0
    busy: int = 0  # runs wanted whose bucket slot was taken (queued or running)
    errors: int = 0  # polls that failed on Redis

    def summary(self) -> dict[str, int]:
        return dict(vars(self))


# ---------------------------------------------------------------- pure decisions


def runs_wanted(backlog: int) -> int:
    """Concurrent runs a bucket's backlog needs."""
    return min(MAX_PARALLEL, max(1, math.ceil(backlog / PER_TRIGGER)))


def cold_lead_ms(estimate: int | None) -> int:
    """How much earlier than a warm one a cold bucket's run is started: COLD_HEADROOM times the
    measured estimate (or the default), within bounds."""
    value = DEFAULT_COLD_START_MS if estimate is None else estimate
    return min(max(0, COLD_HEADROOM * value), MAX_COLD_START_MS)


def is_cold(last_run_ms: int | None, now_ms: int) -> bool:
    """Whether a bucket's runs are likely cold: none started for COLD_AFTER_MS (or ever)."""
    return last_run_ms is None or now_ms - last_run_ms > COLD_AFTER_MS


def next_cold_estimate(previous: int | None, sample_ms: int) -> int:
    """Fold one cold start into the estimate: a decaying peak (``timers.adapters.warmth`` runs
    the same arithmetic in Redis)."""
    sample = min(max(0, sample_ms), MAX_COLD_START_MS)
    if previous is None:
        return sample
    return max(sample, math.floor(previous * COLD_DECAY + sample * (1 - COLD_DECAY) + 0.5))


def cold_start_sample(at_ms: int | None, initialized_ms: int, started_ms: int) -> int | None:
    """A trigger's cold start (invoke -> handler), for its sandbox's first invocation: only
    if the fan-out invoked it before the sandbox had initialized (a sandbox started ahead,
    by the local stack's warm-up or provisioned concurrency, measured nothing cold)."""
    if at_ms is None or at_ms > initialized_ms:
        return None
    return max(0, started_ms - at_ms)


def run_deadline(start_ms: int, remaining_ms: int) -> int:
    """When a fan-out run stops: after MAX_RUN_MS, or STOP_MARGIN_MS before its timeout."""
    return start_ms + max(0, min(MAX_RUN_MS, remaining_ms - STOP_MARGIN_MS))


# ---------------------------------------------------------------- the run


class Fanout:
    """One fan-out run: the lock it may hold, its polls and sweeps."""

    def __init__(self, deps: FanoutDeps) -> None:
        self.deps = deps
        self.token = deps.new_token()
        self.report = FanoutReport()
        self._held = False
        self._renewed_ms = 0
        self._swept_ms: int | None = None
        self._ran: dict[int, int] = {}  # bucket -> when a run of it was last started
        self._ran_written: dict[int, int] = {}  # ... as last written to Redis
        self._cold_lead_ms = cold_lead_ms(None)

    def steps(self, start_ms: int, deadline_ms: int) -> Iterator[int]:
        """Yield each instant to wake at (the driver waits until then), then act at it."""
        at = start_ms
        while at <= deadline_ms:
            yield at
            try:
                self.act()
            except Exception:  # a Redis blip costs this poll, not the rest of the minute
                logger.exception("fanout poll failed")
                self.report.errors += 1
            at = max(at + POLL_MS, self.deps.clock())

    def act(self) -> None:
        """One poll (and, once a second, the sweep) if this run holds the lock."""
        now = self.deps.clock()
        was_held = self._held
        if not self._hold(now):
            self.report.skipped += 1
            return
        warmth = self.deps.warmth
        if warmth is not None and not was_held:  # another holder may have started runs
            for bucket, at in warmth.last_runs().items():
                self._ran[bucket] = max(at, self._ran.get(bucket, at))
        if self._swept_ms is None or now - self._swept_ms >= SWEEP_MS:
            self.deps.index.sweep()
            if warmth is not None:  # the estimate moves only with cold starts: once a sweep
                self._cold_lead_ms = cold_lead_ms(warmth.cold_start_ms())
            self.report.sweeps += 1
            self._swept_ms = now
        self.poll(now)

    def lead_ms(self, bucket: int, now: int) -> int:
        """How long before its earliest due member a bucket's run is started."""
        if self.deps.warmth is None or not is_cold(self._ran.get(bucket), now):
            return LEAD_MS
        return LEAD_MS + self._cold_lead_ms

    def poll(self, now: int) -> None:
        """Start the runs that buckets due within their lead need, smallest backlog first."""
        self.report.polls += 1
        longest = LEAD_MS if self.deps.warmth is None else LEAD_MS + self._cold_lead_ms
        hints = [(b, h) for b, h in self.deps.index.hints_until(now + longest)
                 if h <= now + self.lead_ms(b, now)]  # fmt: skip
        if not hints:
            return
        by_lead: dict[int, list[int]] = {}
        for bucket, _ in hints:
            by_lead.setdefault(self.lead_ms(bucket, now), []).append(bucket)
        backlog: dict[int, int] = {}
        for lead, buckets in by_lead.items():  # a warm bucket's count stops at LEAD_MS
            backlog |= self.deps.index.backlog(buckets, now + lead, now)
        starts: list[tuple[int, int]] = []
        for bucket, hint in sorted(hints, key=lambda h: (backlog[h[0]], h[1])):
            if backlog[bucket] == 0:  # the hint was low (members deferred or taken)
                if self.deps.index.take_hint(bucket, hint):
                    self.deps.index.rehint(bucket)
                continue
            # The hint goes first: a going run that ends after this clears its marker and then
            # re-hints, so the work keeps a hint or a run (taken after a failed start_run, the
            # hint that run's end had just restored would be lost until the sweep).
            self.deps.index.take_hint(bucket, hint)  # the runs (new or going) re-hint at end
            for slot in range(runs_wanted(backlog[bucket])):
                if self.deps.index.start_run(bucket, slot, self.token, START_TTL_MS):
                    starts.append((bucket, slot))
                else:
                    self.report.busy += 1
        self._invoke(starts, now)

    def release(self) -> None:
        if self._held:
            self.deps.lock.release(self.token)
            self._held = False

    def _hold(self, now: int) -> bool:
        if self._held and now - self._renewed_ms >= LOCK_RENEW_MS:
            self._held = self.deps.lock.renew(self.token)
            self._renewed_ms = now
        if not self._held and self.deps.lock.acquire(self.token):
            self._held, self._renewed_ms = True, now
        return self._held

    def _invoke(self, starts: list[tuple[int, int]], now: int) -> None:
        if not starts:
            return
        workers = max(1, min(INVOKE_WORKERS, len(starts)))
        with ThreadPoolExecutor(max_workers=workers) as pool:
            sent = list(pool.map(lambda s: self._invoke_one(s[0], s[1], now), starts))
        self.report.invocations += sum(sent)
        self.report.failed_invocations += len(sent) - sum(sent)
        started = [bucket for (bucket, _), ok in zip(starts, sent, strict=True) if ok]
        self.report.cold_invocations += sum(self.lead_ms(b, now) > LEAD_MS for b in started)
        self._ran.update(dict.fromkeys(started, now))
        stale = sorted({b for b in started if now - self._ran_written.get(b, 0) >= RAN_WRITE_MS})
        if self.deps.warmth is not None and stale:
            self.deps.warmth.ran(stale, now)
            self._ran_written.update(dict.fromkeys(stale, now))

    def _invoke_one(self, bucket: int, slot: int, now: int) -> bool:
        event = {"bucket": bucket, "slot": slot, "token": self.token, "at_ms": now}
        try:
            self.deps.invoke(
                FunctionName=self.deps.trigger_function,
                InvocationType="Event",
                Payload=json.dumps(event).encode(),
            )
        except Exception:  # throttled or failed: free the slot; the sweep re-hints the bucket
            logger.exception("trigger invoke failed", extra={"bucket": bucket})
            self.deps.index.end_run(bucket, slot, self.token)
            return False
        return True


def wait_until(clock: Callable[[], int], sleep: Callable[[float], None], at_ms: int) -> None:
    while (left := at_ms - clock()) > 0:
        sleep(left / 1000)


def run_fanout(deps: FanoutDeps, start_ms: int, deadline_ms: int) -> FanoutReport:
    """Poll from ``start_ms`` to ``deadline_ms`` while holding the lock."""
    fanout = Fanout(deps)
    try:
        for wake_ms in fanout.steps(start_ms, deadline_ms):
            wait_until(deps.clock, deps.sleep, wake_ms)
    finally:
        fanout.release()
    return fanout.report

"""Fan-out: start each bucket's trigger run shortly before its earliest card falls due, and
notice a bucket that lost its data ("No more runs than can start", the Theorem and Durations in
docs/fire-path.md).

EventBridge starts a fan-out every minute; a run goes on a little over a minute, so runs
overlap and a late start leaves no gap. For each bucket due within its lead it wants
``ceil(backlog / PER_TRIGGER)`` runs (at most MAX_PARALLEL) and starts each whose marker it can
set: overlapping fan-outs never start a bucket twice. A bucket whose runs are likely cold (none
started for COLD_AFTER_MS) is started earlier, by its trigger's measured cold start (one that
comes up early leases nothing; the next peek starts it again, warm). The loop yields the
instants it wants to wake at, so tests interleave runs on one fake clock.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from timers.engine import keys
from timers.engine.index import SHARD_WAIT_S, BucketIndex, Peek, PeekPending

logger = logging.getLogger(__name__)

POLL_MS = 100
LEAD_MS = 150
"""A run is started this long before its bucket's head: an async invoke and a warm start
(~20-50 ms in AWS); with POLL_MS it comes up 100-250 ms ahead, within the trigger's ARM_MS."""
PER_TRIGGER = 250  # backlog per concurrent run of one bucket: what a run sends in well under 1 s
MAX_PARALLEL = 8
START_TTL_MS = 5_000  # a marker lives this long until its run extends it (an invoke never run)
BEAT_SKEW_MS = 500  # hosts' clocks may differ this much: a promise lapses only past it
COLD_AFTER_MS = 60_000
"""A bucket with no run started for this long counts as cold (Lambda retires idle sandboxes
after minutes): counting warm sandboxes as cold costs an extra short invocation, the reverse a
cold start's lag."""
MAX_COLD_START_MS = 6_000  # samples, estimates and the cold lead are clamped to 0..this
COLD_HEADROOM = 2  # a cold bucket is started this many estimates early (cold starts vary 2x)
DEFAULT_COLD_START_MS = MAX_COLD_START_MS // COLD_HEADROOM
COLD_DECAY = 0.75  # a decaying peak: a slower start raises it at once, faster ones lower it
RAN_WRITE_MS = 10_000  # a bucket's last run is written to Redis at most this often
RESTORE_MS = 60_000  # a bucket restoring for longer is handed to the migrator again
INVOKE_WORKERS = 16
MAX_RUN_MS = 70_000  # a minute plus slack: the next run overlaps this one
MAX_QUEUED_MS = 60_000  # the trigger's MaximumEventAgeInSeconds: Lambda drops an older event
STOP_MARGIN_MS = 5_000


@dataclass(frozen=True)
class FanoutDeps:
    index: BucketIndex
    invoke: Callable[..., Any]  # boto3 Lambda client's ``invoke`` (or a test's recorder)
    trigger_function: str
    migrator_function: str  # asked to restore a lost bucket
    clock: Callable[[], int]  # epoch ms
    sleep: Callable[[float], None]  # seconds
    new_token: Callable[[], str] = field(default=lambda: uuid.uuid4().hex[:12])
    concurrency: int = 1_000_000  # trigger runs that can run at once (its reserved concurrency)
    shard_wait_s: float | None = SHARD_WAIT_S  # real s; None: every shard (an injected clock)


Start = tuple[int, int, str]  # a run to start: its bucket, slot and token


@dataclass
class Invoked:
    """A run this fan-out invoked (its marker holds the run's own token): queued until the
    marker shows a promise, then leasing, then finishing (``~``: the slot is free again); over
    once its marker is gone or another run's."""

    bucket: int
    slot: int
    at: int  # when it was invoked
    state: str = "queued"  # queued | leasing | finishing


@dataclass
class FanoutReport:
    polls: int = 0
    invocations: int = 0
    cold_invocations: int = 0  # runs started early because the bucket was cold
    failed_invocations: int = 0
    busy: int = 0  # runs wanted whose slot was taken (queued or running)
    held_back: int = 0  # runs wanted beyond what the trigger can run at once (its concurrency)
    lapsed: int = 0  # slots passed over: their run's promised beat lapsed
    errors: int = 0  # buckets that did not answer a peek
    pending: int = 0  # buckets whose shard had not answered the poll in time (no news)
    restores: int = 0  # buckets handed to the migrator

    def summary(self) -> dict[str, int]:
        return dict(vars(self))


def runs_wanted(backlog: int) -> int:
    return min(MAX_PARALLEL, max(1, math.ceil(backlog / PER_TRIGGER)))


def cold_lead_ms(estimate: int | None) -> int:
    value = DEFAULT_COLD_START_MS if estimate is None else estimate
    return min(max(0, COLD_HEADROOM * value), MAX_COLD_START_MS)


def is_cold(last_run_ms: int | None, now_ms: int) -> bool:
    return last_run_ms is None or now_ms - last_run_ms > COLD_AFTER_MS


def next_cold_estimate(previous: int | None, sample_ms: int) -> int:
    """Fold one cold start into the estimate: a decaying peak."""
    sample = min(max(0, sample_ms), MAX_COLD_START_MS)
    if previous is None:
        return sample
    return max(sample, math.floor(previous * COLD_DECAY + sample * (1 - COLD_DECAY) + 0.5))


def cold_start_sample(at_ms: int | None, initialized_ms: int, started_ms: int) -> int | None:
    """A trigger's cold start (invoke -> handler), for its sandbox's first invocation, if the
    fan-out invoked it before the sandbox initialized (one started ahead measured nothing)."""
    if at_ms is None or at_ms > initialized_ms:
        return None
    return max(0, started_ms - at_ms)


def run_deadline(start_ms: int, remaining_ms: int) -> int:
    return start_ms + max(0, min(MAX_RUN_MS, remaining_ms - STOP_MARGIN_MS))


class Fanout:
    """One fan-out run."""

    def __init__(self, deps: FanoutDeps) -> None:
        self.deps = deps
        self.token = deps.new_token()
        self.report = FanoutReport()
        self._ran: dict[int, int] = {}  # bucket -> when a run of it was last started
        self._ran_written: dict[int, int] = {}
        self._down: dict[int, int] = {}  # bucket -> since when it did not answer
        self._runs: dict[str, Invoked] = {}  # its runs in flight, by their tokens
        self._serial = itertools.count()  # each run's token: the fan-out's and a number

    def steps(self, start_ms: int, deadline_ms: int) -> Iterator[int]:
        """Yield each instant to wake at (the driver waits), then act at it."""
        at = start_ms
        while at <= deadline_ms:
            yield at
            try:
                self.act()
            except Exception:  # a failed poll costs this poll, not the rest of the minute
                logger.exception("fanout poll failed")
                self.report.errors += 1
            at = max(at + POLL_MS, self.deps.clock())

    def act(self) -> None:
        now = self.deps.clock()
        self.report.polls += 1
        buckets = range(self.deps.index.bucket_count)
        try:
            peeks = self.deps.index.peek(buckets, now + LEAD_MS, self.deps.shard_wait_s)
        except Exception as exc:  # no answer at all (a single node failing over): every bucket
            logger.warning("fanout peek failed", exc_info=True)
            self.report.errors += 1
            peeks = dict.fromkeys(buckets, exc)
            whole = True
        else:
            whole = False
        lost: list[int] = []
        due: list[tuple[int, int]] = []  # (bucket, backlog)
        cold_due: set[int] = set()
        for bucket in buckets:
            peek = peeks[bucket]
            if isinstance(peek, PeekPending):  # its shard is slow to answer: no news
                self.report.pending += 1
                continue
            if isinstance(peek, Exception):
                self.report.errors += not whole
                self._down.setdefault(bucket, now)
                continue
            try:
                if self._lost(bucket, peek, now):
                    lost.append(bucket)
            except Exception:  # its shard refuses writes: the next poll tries again
                logger.warning("bucket %s not marked restoring", bucket, exc_info=True)
                self.report.errors += 1
            ran = max(self._ran.get(bucket, 0), peek.ran or 0) or None
            cold = is_cold(ran, now)
            lead = LEAD_MS + (cold_lead_ms(peek.cold) if cold else 0)
            if peek.head is not None and peek.head <= now + lead:
                due.append((bucket, max(1, peek.backlog)))
                if cold:
                    cold_due.add(bucket)
        if lost:
            self._restore(lost)
        self._invoke(self._starts(sorted(due, key=lambda d: d[1]), now), now, cold_due)

    def _starts(self, due: list[tuple[int, int]], now: int) -> list[Start]:
        """The runs to start, within what the trigger can run at once beside the runs in
        flight: a first run for each due bucket (smallest backlog first), then more for those
        with a backlog. A run invoked beyond it would only wait in Lambda's queue - and lease
        nothing by the time it starts."""
        budget = self.deps.concurrency - self._in_flight(now)
        starts: list[Start] = []
        first_free: dict[int, int] = {}  # bucket -> the slot after its first run's
        for first in (True, False):
            for bucket, backlog in due:
                if budget <= 0:
                    self.report.held_back += 1
                    continue
                if not first and bucket not in first_free:
                    continue  # its shard refused the first: the next poll tries again
                begin = 0 if first else first_free[bucket]
                wanted = 1 if first else runs_wanted(backlog)
                try:
                    more, first_free[bucket] = self._start(bucket, begin, wanted, now, budget)
                except Exception:  # its shard refuses writes: the others go on
                    logger.warning("bucket %s not started", bucket, exc_info=True)
                    self.report.errors += 1
                    continue
                starts += more
                budget -= len(more)
        return starts

    def _in_flight(self, now: int) -> int:
        """This fan-out's runs still queued, leasing or finishing (their markers, read in one
        round trip). A queued run's marker is kept alive until its run starts, or Lambda would
        have dropped its event: a run that waits for a sandbox is not started twice."""
        if not self._runs:
            return 0
        try:
            markers = self.deps.index.runs({(r.bucket, r.slot) for r in self._runs.values()})
        except Exception:  # unknown: count them all as in flight (errs towards fewer runs)
            logger.warning("runs in flight not read", exc_info=True)
            return len(self._runs)
        for token, run in list(self._runs.items()):
            if (run.bucket, run.slot) not in markers:
                continue  # its shard did not answer: as it was
            held = markers[(run.bucket, run.slot)]
            if held is None or held.partition("@")[0].rstrip("~") != token:
                del self._runs[token]  # over (or the slot is another run's now)
            elif held.endswith("~"):
                run.state = "finishing"
            elif "@" in held:
                run.state = "leasing"
            elif now - run.at > MAX_QUEUED_MS:
                del self._runs[token]  # Lambda drops an event this old
            else:
                try:  # queued: kept until it starts
                    self.deps.index.touch_run(run.bucket, run.slot, token, START_TTL_MS)
                except Exception:  # it may expire: a second run of the slot is harmless
                    logger.warning("queued run not kept", exc_info=True)
        return len(self._runs)

    def _start(
        self, bucket: int, slot: int, wanted: int, now: int, budget: int
    ) -> tuple[list[Start], int]:
        """Mark the free slots from ``slot`` up to the ``wanted`` first (at most ``budget``);
        a slot whose run's promised beat lapsed (it died, or hangs in a slow call) is passed
        over for one more slot. A run not started yet (queued, throttled) promised nothing:
        its marker expires after START_TTL_MS unless the fan-out that invoked it keeps it.
        Returns the starts and the slot after the last one tried."""
        starts: list[Start] = []
        while slot < wanted and len(starts) < budget:
            token = f"{self.token}-{next(self._serial)}"
            if self.deps.index.start_run(bucket, slot, token, START_TTL_MS):
                starts.append((bucket, slot, token))
            elif (beat := self.deps.index.run_promise(bucket, slot)) is not None and (
                beat < now - BEAT_SKEW_MS
            ):
                wanted = min(MAX_PARALLEL, wanted + 1)
                self.report.lapsed += 1
            else:
                self.report.busy += 1
            slot += 1
        return starts, slot

    def _lost(self, bucket: int, peek: Peek, now: int) -> bool:
        """Whether the bucket must be restored now. The sentinel is swapped from what this
        peek saw, so of overlapping fan-outs one wins and the bucket is handed over once: to
        ``r<epoch>.<asked>``, a new epoch for a new loss (the sentinel gone, or the bucket back
        from an outage: a failover may have lost writes), the same epoch when a restore is only
        asked again (its progress so far stands)."""
        seen, swap = peek.sentinel, self.deps.index.swap_field
        if (since := self._down.get(bucket)) is not None:
            epoch = seen[1:].partition(".")[0] if seen and seen.startswith("r") else ""
            if epoch and int(epoch) >= since:  # another fan-out marked it since it went down
                del self._down[bucket]
                return False
            won = swap(bucket, keys.SENTINEL, seen, f"r{now}.{now}")
            if won:  # else the sentinel changed since the peek (a restore ended): next poll
                del self._down[bucket]
            return won
        if seen is None:
            return swap(bucket, keys.SENTINEL, None, f"r{now}.{now}")
        if seen.startswith("r"):
            epoch, _, asked = seen.partition(".")
            if now - int(asked or epoch[1:]) > RESTORE_MS:
                return swap(bucket, keys.SENTINEL, seen, f"{epoch}.{now}")
        return False

    def _restore(self, buckets: list[int]) -> None:
        self.report.restores += len(buckets)
        try:
            self._invoke_async(self.deps.migrator_function, {"restore": buckets})
        except Exception:  # the next minute's migrator run restores them (they stay marked)
            logger.exception("restore invoke failed", extra={"buckets": buckets})

    def _invoke(self, starts: list[Start], now: int, cold: set[int]) -> None:
        if not starts:
            return
        with ThreadPoolExecutor(max_workers=max(1, min(INVOKE_WORKERS, len(starts)))) as pool:
            sent = list(pool.map(lambda s: self._invoke_one(s[0], s[1], s[2], now), starts))
        self.report.invocations += sum(sent)
        self.report.failed_invocations += len(sent) - sum(sent)
        started = {bucket for (bucket, _, _), ok in zip(starts, sent, strict=True) if ok}
        for (bucket, slot, token), ok in zip(starts, sent, strict=True):
            if ok:
                self._runs[token] = Invoked(bucket, slot, now)
        self.report.cold_invocations += len(started & cold)
        for bucket in started:
            self._ran[bucket] = now
            if now - self._ran_written.get(bucket, 0) >= RAN_WRITE_MS:
                try:
                    self.deps.index.set_field(bucket, keys.RAN, now)
                    self._ran_written[bucket] = now
                except Exception:  # warmth is a hint: a failure errs towards cold
                    logger.warning("ran not written", exc_info=True)

    def _invoke_one(self, bucket: int, slot: int, token: str, now: int) -> bool:
        event = {"bucket": bucket, "slot": slot, "token": token, "at_ms": now}
        try:
            self._invoke_async(self.deps.trigger_function, event)
        except Exception:  # throttled or failed: free the slot; the next peek tries again
            logger.exception("trigger invoke failed", extra={"bucket": bucket})
            self.deps.index.end_run(bucket, slot, token)
            return False
        return True

    def _invoke_async(self, function: str, event: dict[str, Any]) -> None:
        payload = json.dumps(event).encode()
        self.deps.invoke(FunctionName=function, InvocationType="Event", Payload=payload)


def run_fanout(deps: FanoutDeps, start_ms: int, deadline_ms: int) -> FanoutReport:
    fanout = Fanout(deps)
    for wake_ms in fanout.steps(start_ms, deadline_ms):
        while (left := wake_ms - deps.clock()) > 0:
            deps.sleep(left / 1000)
    return fanout.report

"""The trigger: fire one bucket's due cards on time, once, and never early.

A run is *armed*: it leases what falls due within ARM_MS, claims it while it is still in the
future (one conditional write per fire-log item and chunk), waits for each due instant by the
reference clock, sends, records, moves checkpoints where needed, and settles each card in Redis
(chained to its next position, or dropped). It loops while something is due within ARM_MS.

What a crash at each step leaves (``hooks`` lets tests crash there), once its leases end:

- leased: a run leases the cards again and does everything: nothing was sent;
- claimed: a run takes the lapsed claims over and sends: nothing was sent before;
- sent: a run takes the lapsed claims over and sends AGAIN: the duplicate window;
- recorded / checkpointed: a run finds the fires recorded and only chains;
- finished: nothing is left.

**Never early**: a send starts only when the lower bound of the reference time (Redis ``TIME``,
kept between measures by the monotonic clock) has passed the fire's due time plus
SEND_GUARD_MS; without a trusted offset the run sends nothing. **Deadline-aware**: no lease,
claim or send starts unless it and everything after it end before the invocation's deadline;
what a run will not finish it hands back at once (claims released, cards due again).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from typing import Any, Literal, NamedTuple, Protocol, TypeVar

from botocore.exceptions import BotoCoreError, ClientError
from pynamodb.exceptions import PynamoDBException

from timers.core.lag import lateness_ms
from timers.core.schedule import is_recurring
from timers.core.timer import Timer
from timers.engine.changes import Checkpoints
from timers.engine.entries import (
    LAPSE_MARGIN_MS,
    Entry,
    EntryRef,
    State,
    Step,
    decide_claim,
    entry_for,
    hold_ms,
    misfire_grace_ms,
    needs_checkpoint,
    ref_of,
    step,
    successor,
)
from timers.engine.index import RUN_BEAT_MS, BucketIndex, Card
from timers.engine.log import CHUNK, MAX_DEPTH, FireLog, chunks
from timers.engine.sending import Delivery, Sender, SqsPort
from timers.store.timers_table import TimerStore
from timers.tenancy.usage import FINISHED, count_fires

log = logging.getLogger(__name__)
T = TypeVar("T")

ARM_MS = 250  # lease and claim what falls due this far ahead, then wait to send it
LEASE_LIMIT = 100  # cards per lease: at most two claim writes per item, made in parallel
FIRST_LEASE = 10  # a run's first lease: small, so a crowd's first round is claimed and sent at once
SEND_FIRST_MS = 20  # a send due this soon goes before the next lease
SEND_GUARD_MS = 1  # sent once the reference time's lower bound is this far past due
MAX_CLOCK_OFFSET_MS = 2_000  # a host clock further off than this is broken: refuse
MAX_CLOCK_ERROR_MS = 100  # an offset measured by a round trip longer than twice this: refuse
CLOCK_RESYNC_MS = 5_000
REDIS_CALL_MS = 1_000  # worst case of one Redis call (the client's socket timeout)
DYNAMO_CALL_MS = 3_500  # of one claim or read: 0.5 s connect + 3 s read
RECORD_CALL_MS = 8_500  # of one record attempt: 0.5 s connect + 8 s read
SQS_CALL_MS = 9_000  # of one SendMessageBatch attempt: 1 s connect + 8 s read
TAIL_MS = REDIS_CALL_MS + 500  # the handler after a run: a Redis write, its log line and metrics
SEND_RESERVE_MS = SQS_CALL_MS + RECORD_CALL_MS + 2 * REDIS_CALL_MS + TAIL_MS
"""A send starts only with this left: the send, its record, the settle, clearing the marker
and the handler's tail. Every other call starts only if it ends before the tail (_affords):
a run ends before its function's timeout however slow each call is."""
STOP_LEASING_MS = 15_000  # a run takes no new work after this: the fan-out re-spreads a backlog
LEASE_GRACE_MS = LAPSE_MARGIN_MS + 1_000  # a lease ends only after the run's claims lapsed
CLAIM_ATTEMPTS = 3  # tries of one claim write before its cards are given back
CLAIM_RETRY_MS = 1_000  # a chunk whose claims kept failing is leasable again this much later
HAND_BACK_RETRY_MS = 500  # a hand-back Redis refused is tried again while the run has time
ITEM_WORKERS = 8  # fire-log items claimed in parallel (one item's chunks go in turn)
RECORD_WORKERS = 16  # record writes in parallel: the DynamoDB clients' connection pool
TAKE_CHUNK = 25  # entries one take-over write replaces (its condition names each one)
CHECKPOINT_CALL_MS = 2 * DYNAMO_CALL_MS  # a checkpoint's move: its listing, then the timer


class OutOfTime(Exception):
    """A call the run's deadline leaves no room for: not started."""


Hook = Literal["leased", "claimed", "sent", "recorded", "checkpointed", "finished"]
HOOKS: tuple[Hook, ...] = ("leased", "claimed", "sent", "recorded", "checkpointed", "finished")


@dataclass
class Pace:
    """How long a sandbox's calls take (a decaying peak, like the fan-out's cold starts), to
    size its runs' leases: no more cards than a run can claim and send in the time its sends
    may still start in - a slow DynamoDB or SQS makes runs lease less, never claim what they
    must hand back."""

    claim_ms: int = 0  # a lease's claims (parallel per item)
    batch_ms: int = 0  # one SendMessageBatch (a lane's batches go in turn)

    def claimed(self, ms: int) -> None:
        self.claim_ms = _peak(self.claim_ms, ms)

    def sent(self, ms: int) -> None:
        self.batch_ms = _peak(self.batch_ms, ms)

    def lease_size(self, window_ms: int, limit: int) -> int:
        """Cards to lease with ``window_ms`` left for sends to start: all ``limit`` while the
        calls are fast; else the batches of 10 one lane sends in the window, after a claim."""
        if self.batch_ms * (limit // 10) + self.claim_ms <= window_ms:
            return limit
        batches = (window_ms - self.claim_ms) // max(1, self.batch_ms) + 1
        return max(1, min(limit, 10 * batches))


def _peak(previous: int, sample: int) -> int:
    return max(sample, (3 * previous + sample) // 4)


class Timed:
    """The SQS client, each SendMessageBatch timed into the run's pace."""

    def __init__(self, sqs: SqsPort, now: Callable[[], int], pace: Pace) -> None:
        self.sqs, self.now, self.pace = sqs, now, pace

    def send_message_batch(self, *, QueueUrl: str, Entries: Sequence[Any]) -> Any:
        began = self.now()
        try:
            return self.sqs.send_message_batch(QueueUrl=QueueUrl, Entries=Entries)
        finally:
            self.pace.sent(self.now() - began)


@dataclass
class TriggerDeps:
    index: BucketIndex
    log: FireLog
    timers: TimerStore
    checkpoints: Checkpoints  # a listing first, then the timer (R3, R4)
    sqs: SqsPort
    clock: Callable[[], int]  # this host's clock, epoch ms
    reference: Callable[[], int]  # the reference clock (Redis TIME), epoch ms
    lookahead_ms: int
    retention_ms: int
    sleep: Callable[[float], None] = time.sleep
    hooks: Callable[[Hook], None] | None = None  # crash seams for tests
    new_owner: Callable[[], str] = field(default=lambda: uuid.uuid4().hex[:12])
    lease_limit: int = LEASE_LIMIT
    delivery_queue_url: str = ""  # HTTP targets' fires go here (the delivery function)
    monotonic: Callable[[], int] | None = None  # elapsed time, ms (default: ``clock``)
    usage: UsagePort | None = None  # the tenants' usage counters (None: not counted)
    pace: Pace = field(default_factory=Pace)  # the sandbox's: kept across its runs


class UsagePort(Protocol):
    def add(
        self, tenant: str, month: str, counts: Mapping[str, int], shard: int | None = None
    ) -> None: ...


@dataclass
class TriggerReport:
    bucket: int
    leases: int = 0
    leased: int = 0
    stale: int = 0  # dropped: a newer revision fenced it, or the timer is gone
    skipped: int = 0  # positions the misfire policy skipped
    already_fired: int = 0  # found finished: only chained
    held: int = 0  # another run's live claim: deferred until it lapses
    enqueued: int = 0
    failed: int = 0
    handed_back: int = 0  # leased or claimed, then given back (deadline)
    early: int = 0  # leased before their send instant (an older card's score): back until then
    taken_over: int = 0  # lapsed claims of dead runs: maybe sent once already
    refused: int = 0  # not sent: the clock could not be trusted
    ambiguous: int = 0  # send attempts that timed out after the request went
    unrecorded: int = 0  # sent and not recorded as ours: sent again by whoever finishes it
    lags_ms: list[int] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)  # "<fire id>: <reason>"

    def summary(self) -> dict[str, int]:
        return {
            k: v for k, v in vars(self).items() if isinstance(v, int) and not isinstance(v, bool)
        }


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


# ---------------------------------------------------------------- claims


@dataclass
class Job:
    """One leased card on its way through a run."""

    card: Card
    fresh: bool  # the timer active at the card's revision: may create a claim (R2)
    decided: Step | None = None  # what a fresh card fires
    entry: Entry | None = None  # what holds the position: ours, or the one found
    home: str | None = None  # the fire-log item the entry lives in, once located
    delivery: Delivery | None = None

    @property
    def timer(self) -> Timer:
        return self.card.timer

    @property
    def name(self) -> str:
        return self.root[1]

    @property
    def root(self) -> EntryRef:
        return ref_of(self.timer, self.card.pos)

    @property
    def ref(self) -> EntryRef:
        return (self.home or self.root[0]), self.name

    @property
    def fire_ms(self) -> int:
        """The occurrence fired: the claim's decision, whoever made it (a takeover keeps it)."""
        if self.entry is not None:
            return self.entry.fired if self.entry.fired is not None else self.card.pos
        fired = self.decided.fire_ms if self.decided is not None else None
        return fired if fired is not None else self.card.pos

    @property
    def send_at(self) -> int:
        return max(self.card.due_at, self.fire_ms)

    @property
    def done(self) -> Entry:
        """The entry, once the job has one (claimed, found, or recorded)."""
        assert self.entry is not None
        return self.entry


class Onward(NamedTuple):
    """A finished job's way on: its chain's owner (None: it stops), successor, whether that is
    held in Redis, and so whether the checkpoint must move first."""

    job: Job
    timer: Timer | None
    following: int | None
    chained: bool

    @property
    def needs_checkpoint(self) -> bool:
        t = self.timer
        return bool(
            t and is_recurring(t.schedule) and needs_checkpoint(self.job.done, self.chained)
        )


class Take(NamedTuple):
    """An entry to take over: a fence of an older revision, or a lapsed claim."""

    job: Job
    mine: Entry
    old: Entry


@dataclass
class Claimed:
    ours: list[Job] = field(default_factory=list)  # pending: to send; finished: to chain
    held: dict[Card, int] = field(default_factory=dict)  # leasable again from the score
    stale: list[Card] = field(default_factory=list)
    given_back: int = 0
    taken_over: int = 0
    already_fired: int = 0

    def add(self, other: Claimed) -> None:
        self.ours += other.ours
        self.held.update(other.held)
        self.stale += other.stale
        self.given_back += other.given_back
        self.taken_over += other.taken_over
        self.already_fired += other.already_fired


@dataclass
class Claimer:
    """A fresh card claims its position with one conditional write per item and chunk (at the
    root of its path, or below the full items seen); when a write fails, one consistent read
    locates each entry and :func:`decide_claim` sorts it out (R1, R2)."""

    log: FireLog
    owner: str
    until: int  # the claims hold until then (the run's deadline)
    now: Callable[[], int]
    may_write: Callable[[], bool]

    @property
    def chunk(self) -> int:
        return min(CHUNK, self.log.cap // 2)

    def claim(self, jobs: Sequence[Job]) -> Claimed:
        out = Claimed()
        by_item = self._by_home([j for j in jobs if j.fresh])
        if by_item:
            with ThreadPoolExecutor(max(1, min(ITEM_WORKERS, len(by_item)))) as pool:
                for part in pool.map(self._claim_item, by_item.items()):
                    out.add(part)
        if stale := [j for j in jobs if not j.fresh]:
            out.add(self._sort_out(stale))
        return out

    def _by_home(self, jobs: Sequence[Job]) -> dict[str, list[Job]]:
        by_item: dict[str, list[Job]] = defaultdict(list)
        now = self.now()
        for job in {job.name: job for job in jobs}.values():
            by_item[self.log.home_guess(job.ref, now)].append(job)
        return by_item

    def _claim_item(self, item: tuple[str, list[Job]]) -> Claimed:
        key, jobs = item
        out = Claimed()
        while jobs:
            chunk, jobs = jobs[: self.chunk], jobs[self.chunk :]
            out.add(self._claim_chunk(key, chunk))
            regrouped = self._by_home(jobs)  # a write that found the item sealed learnt it
            if regrouped.keys() - {key}:
                for below in regrouped.items():
                    out.add(self._claim_item(below))
                break
        return out

    def _claim_chunk(self, key: str, jobs: list[Job], depth: int = 0) -> Claimed:
        """One conditional write; on failure, a read sorts it out. A write that times out is
        tried again with the same owner (one applied despite the error is then ours)."""
        entries = {job.name: self._mine(job) for job in jobs}
        for attempt in range(CLAIM_ATTEMPTS):
            if not self.may_write():  # no time for it: the cards go back as they were
                return Claimed(held={j.card: j.card.due_at for j in jobs}, given_back=len(jobs))
            seen: dict[str, Any] = {}  # the item as it stood, if the claim is refused
            try:
                if self.log.claim(key, entries, seen):
                    for job in jobs:
                        job.entry, job.home = entries[job.name], key
                    return Claimed(ours=list(jobs))
                return self._sort_out(jobs, depth, seen)
            except (BotoCoreError, ClientError):
                if attempt + 1 < CLAIM_ATTEMPTS:
                    log.warning("claim failed; retrying", exc_info=True)
                    continue
                log.warning("claim failed; cards given back", exc_info=True)
        later = self.now() + CLAIM_RETRY_MS
        return Claimed(held={j.card: max(j.card.due_at, later) for j in jobs}, given_back=len(jobs))

    def _mine(self, job: Job) -> Entry:
        assert job.decided is not None
        c = job.card
        return entry_for(job.decided, c.timer.rev, c.pos, c.pv, self.owner, self.until)

    def _sort_out(
        self, jobs: Sequence[Job], depth: int = 0, seen: dict[str, Any] | None = None
    ) -> Claimed:
        """Locate each entry (one consistent read, less what a refused claim returned) and
        decide: claim, take over (one write per item), wait, or drop."""
        out = Claimed()
        if not self.may_write():  # no time to look: back as they were
            return Claimed(held={j.card: j.card.due_at for j in jobs}, given_back=len(jobs))
        roots = [job.root for job in jobs]
        found = self.log.locate(roots, consistent=True, learn=True, seen=seen)
        now = self.now()
        to_claim: dict[str, list[Job]] = defaultdict(list)
        to_take: dict[str, list[Take]] = defaultdict(list)
        counts: dict[str, int] = {}
        for job in jobs:
            at = found[job.root]
            job.home = at.key
            action = decide_claim(
                at.entry, rev=job.timer.rev, fresh=job.fresh, owner=self.owner, now_ms=now
            )
            if action in ("claim", "take_over") and not self.may_write():
                out.held[job.card] = job.card.due_at
            elif action == "claim" and at.entry is None:
                to_claim[at.key].append(job)
                counts[at.key] = at.count
            elif action == "claim":  # over a fence of an older revision
                assert at.entry is not None
                to_take[at.key].append(Take(job, self._mine(job), at.entry))
            elif action == "take_over":  # the claimant is gone; its decision stands
                assert at.entry is not None
                mine = replace(at.entry, owner=self.owner, until=self.until)
                to_take[at.key].append(Take(job, mine, at.entry))
            elif action in ("ours", "done"):
                job.entry = at.entry
                out.ours.append(job)
                out.already_fired += action == "done"
            elif action == "wait":  # back when that claim lapses
                assert at.entry is not None
                out.held[job.card] = max((at.entry.until or 0) + LAPSE_MARGIN_MS, now + 1)
            else:
                out.stale.append(job.card)
        for key, takes in to_take.items():
            for start in range(0, len(takes), TAKE_CHUNK):
                self._take(key, takes[start : start + TAKE_CHUNK], out)
        for key, group in to_claim.items():
            full = counts[key] + len(group) > self.log.cap
            # depth: cannot happen while seals only go down; never loop. A seal takes time too.
            if depth > MAX_DEPTH + 1 or (full and not self.may_write()):
                out.held.update({j.card: j.card.due_at for j in group})
            elif full:
                self.log.seal(key)  # no room: its positions' homes are below it from now on
                out.add(self._sort_out(group, depth + 1))
            else:
                for chunk in chunks({j.name: j for j in group}, self.chunk):
                    out.add(self._claim_chunk(key, list(chunk.values()), depth + 1))
        return out

    def _take(self, key: str, takes: Sequence[Take], out: Claimed) -> None:
        """Take the entries over in one write, all as read; if one changed meanwhile, each on
        its own (a raced one goes back, to be looked at again at once)."""
        if not self.may_write():
            out.held.update({t.job.card: t.job.card.due_at for t in takes})
            return
        if len(takes) > 1 and not self.log.take_over_many(
            key, {t.job.name: (t.mine, t.old) for t in takes}
        ):
            for take in takes:
                self._take(key, [take], out)
            return
        if len(takes) == 1 and not self.log.take_over(key, takes[0].job.name, *takes[0][1:]):
            out.held[takes[0].job.card] = takes[0].job.card.due_at
            return
        for take in takes:
            take.job.entry = take.mine
            out.ours.append(take.job)
            out.taken_over += take.old.state == "p"


# ---------------------------------------------------------------- a run


@dataclass(frozen=True)
class RunMarker:
    slot: int
    token: str


def run_trigger(
    deps: TriggerDeps, bucket: int, remaining_ms: int, marker: RunMarker | None = None
) -> TriggerReport:
    """Fire the bucket's cards due within ARM_MS, and keep going while more fall due. With the
    fan-out's ``marker``, the run beats on its slot while it leases and clears it once it stops
    (the fan-out's next peek then starts a run for whatever came due meanwhile)."""
    try:
        run = Run(deps, bucket, remaining_ms, marker)
    except Exception:  # no reference time: the marker goes, so the next poll starts a run
        if marker is not None:
            try:
                deps.index.end_run(bucket, marker.slot, marker.token)
            except Exception:  # it expires with its TTL
                log.warning("run marker not cleared", exc_info=True)
        raise
    try:
        report = run.go()
    except Exception:
        log.exception("trigger run failed", extra=run.report.summary())
        run.clear()  # not on a kill (BaseException in tests): a killed run does nothing
        raise
    return report


class Run:
    def __init__(
        self, deps: TriggerDeps, bucket: int, remaining_ms: int, marker: RunMarker | None = None
    ) -> None:
        self.deps = deps
        self.bucket = bucket
        self.marker = marker
        self.report = TriggerReport(bucket)
        self.owner = deps.new_owner()
        self.sync = ClockSync(deps.clock, deps.reference, deps.monotonic)
        self.sync.measure()
        self.started = self.sync.now()
        self.end = self.started + remaining_ms  # the invocation's hard end, reference time
        self.pending: list[Job] = []  # claimed, waiting for their send instant
        self.next_due: int | None = None  # when the bucket next has something to lease
        self.held: dict[str, Card] = {}  # leased and not yet settled, by member
        self.pace = deps.pace  # how long calls take: leases are sized to the time left
        self.sender = Sender(
            Timed(deps.sqs, self.sync.now, self.pace),
            self.sync.now,
            deps.sleep,
            self._may_send,
            delivery_queue_url=deps.delivery_queue_url,
        )
        self._hook = deps.hooks or (lambda _: None)
        self._hold_ms = hold_ms(deps.lookahead_ms, deps.retention_ms)
        self._beat_at: int | None = None
        self._finishing = False  # its marker says it leases no more
        self.counting: list[Future[None]] = []  # its usage writes (USAGE_WRITER)

    def go(self) -> TriggerReport:
        if not self.sync.trusted:
            log.error(
                "clock not trusted; not firing",
                extra={"offset_ms": self.sync.wall_offset, "error_ms": self.sync.error},
            )
            self.report.refused += 1
            self.clear()  # another sandbox's run may start at the next poll
            return self.report
        self.next_due = self.started  # unknown yet: lease at once
        try:
            while True:
                # What is due goes out first: a backlog is leased, claimed and sent a lease at
                # a time, never claimed whole before the first send.
                if self._sendable() and not self._send_due():
                    break  # refused: out of time, or the clock is no longer trusted
                now = self.sync.now()
                may_lease = self._may_lease(now)
                if may_lease:
                    self._beat(now)
                else:
                    self.unmark()
                soon = bool(self.pending) and self.pending[0].send_at - now <= SEND_FIRST_MS
                leasable = self.next_due is not None and self.next_due <= now + ARM_MS
                if may_lease and leasable and not soon:
                    self.next_due = self._lease_and_claim()
                    continue
                if not self.pending:
                    break
                wake = self.pending[0].send_at + SEND_GUARD_MS
                if may_lease and self.next_due is not None and not soon:
                    wake = min(wake, max(now + 1, self.next_due - ARM_MS))
                while (left := wake - self.sync.lower()) > 0:
                    self.deps.sleep(left / 1000)
        except Exception:  # a run that dies (BaseException: killed) does neither
            self._stop()
            raise
        self._stop()
        return self.report

    def _stop(self) -> None:
        self._hand_back()
        self.unmark()  # the bucket's next run may start while this one's counts are written
        self._counted()
        self.clear()

    def _beat(self, now: int) -> None:
        """Promise the next beat within RUN_BEAT_MS (every half of it): a run that dies or
        hangs lets its promise lapse, and the fan-out starts another for the bucket."""
        if (
            self.marker is None
            or self._finishing
            or (self._beat_at is not None and now - self._beat_at < RUN_BEAT_MS // 2)
        ):
            return
        ttl = self.end - now + LEASE_GRACE_MS
        try:
            self.deps.index.touch_run(
                self.bucket, self.marker.slot, self.marker.token, ttl, now + RUN_BEAT_MS
            )
        except Exception:  # the fan-out may start a second run: harmless
            log.warning("run marker not touched", exc_info=True)
        self._beat_at = now

    def unmark(self) -> None:
        """Free the slot once this run leases no more (its sends may go on): the marker says
        it is finishing (the fan-out may start another run in the slot, and still counts this
        one among the runs in flight)."""
        if self.marker is None or self._finishing:
            return
        self._finishing = True
        try:
            ttl = max(1, self.end - self.sync.now()) + LEASE_GRACE_MS
            self.deps.index.finishing_run(self.bucket, self.marker.slot, self.marker.token, ttl)
        except Exception:  # it expires with its TTL
            log.warning("run marker not freed", exc_info=True)

    def clear(self) -> None:
        """The run is over: its marker goes (if still its own)."""
        self.unmark()
        if self.marker is None:
            return
        marker, self.marker = self.marker, None
        try:
            self.deps.index.end_run(self.bucket, marker.slot, marker.token)
        except Exception:  # it expires with its TTL
            log.warning("run marker not cleared", exc_info=True)

    def _sendable(self) -> bool:
        return bool(self.pending) and self.sync.lower() >= self.pending[0].send_at + SEND_GUARD_MS

    def _left(self) -> int:
        return self.end - self.sync.now()

    def _affords(self, call_ms: int) -> bool:
        """Whether a call of this worst case ends before the handler's tail must start."""
        return self._left() - TAIL_MS >= call_ms

    def _may_lease(self, now: int) -> bool:
        work = REDIS_CALL_MS + DYNAMO_CALL_MS + SEND_RESERVE_MS
        return now - self.started < STOP_LEASING_MS and self._left() > work

    def _may_claim(self) -> bool:
        return self._left() > DYNAMO_CALL_MS + SEND_RESERVE_MS

    def _may_send(self, deliveries: Sequence[Delivery]) -> bool:
        """An attempt starts only if it, its record and its settle end before the deadline,
        and only when every fire in it is due by the lower bound of the reference time."""
        if self._left() <= SEND_RESERVE_MS:
            return False
        if self.sync.stale():
            self.sync.measure()
        if not self.sync.trusted:
            self.report.refused += 1
            return False
        return self.sync.lower() >= max((d.fire_ms for d in deliveries), default=0) + SEND_GUARD_MS

    # ------------------------------------------------------------ lease, triage, claim

    def _lease_and_claim(self) -> int | None:
        self.next_due = None
        self.sync.measure()
        if not self.sync.trusted:
            self.report.refused += 1
            return None
        now = self.sync.now()
        limit = self.pace.lease_size(self._left() - SEND_RESERVE_MS, self.deps.lease_limit)
        if not self.report.leases:  # its first: small, so what is due first goes out first
            limit = min(limit, FIRST_LEASE)
        leased = self.deps.index.lease(self.bucket, now + ARM_MS, self.end + LEASE_GRACE_MS, limit)
        self.report.leases += 1
        self.report.leased += len(leased.cards)
        self.held.update((c.member, c) for c in leased.cards)
        self._hook("leased")
        jobs = self._triage(leased.cards)
        if not self._may_claim():
            return leased.next_due  # the hand-back gives the leases back
        claimer = Claimer(self.deps.log, self.owner, self.end, self.sync.now, self._may_claim)
        began = self.sync.now()
        claimed = claimer.claim(jobs)
        self.pace.claimed(self.sync.now() - began)
        self.report.taken_over += claimed.taken_over
        self.report.already_fired += claimed.already_fired
        self.report.handed_back += claimed.given_back
        # The fresh claims join the pending first: a Redis error below ends the run, and its
        # hand-back must release them too (else they wait for their claims to lapse).
        waiting = {j.root for j in self.pending}  # a card restored meanwhile: leased again
        firing = [
            j
            for j in claimed.ours
            if j.entry is not None and j.entry.state == "p" and j.root not in waiting
        ]
        for job in firing:
            job.delivery = Delivery(job.timer, job.fire_ms, ref=job.ref)
        self.pending = sorted(self.pending + firing, key=lambda j: j.send_at)
        if claimed.held:
            self.report.held += len(claimed.held) - claimed.given_back
            self._release(claimed.held)
        if claimed.stale:
            self.report.stale += len(claimed.stale)
            self._drop(claimed.stale)
        self._hook("claimed")
        finished = [j for j in claimed.ours if j.entry is not None and j.entry.finished]
        self._counts([j for j in finished if j.entry and j.entry.owner == self.owner])  # skips
        self._finish(finished)
        return _earliest(leased.next_due, self.next_due)

    def _triage(self, cards: Sequence[Card]) -> list[Job]:
        """A card of an active timer is *fresh* and decided now (the misfire policy); any other
        only takes over, waits for or acknowledges a claim. A card overdue by more than half the
        retention is checked against DynamoDB: the fence that stops a stale card (a change whose
        Redis update failed) expires with its fire-log item. A card whose send instant is not
        within ARM_MS (leased early: a score written for an older card of its timer, such as a
        lease kept by a change that widened the window, or a hand-back of the card before it)
        goes back to its send instant unclaimed: no run waits for an instant past its reach,
        and the run leasing it then claims or takes it over and sends it."""
        now = self.sync.now()
        early = {c: c.due_at for c in cards if c.due_at > now + ARM_MS}
        if early:
            self.report.early += len(early)
            self._release(early)
            cards = [c for c in cards if c not in early]
        old = {c.member for c in cards if c.pos < now - self.deps.retention_ms // 2}
        if old and not self._affords(DYNAMO_CALL_MS):  # no time to read them: back as they are
            self._release({c: c.due_at for c in cards if c.member in old})
            cards = [c for c in cards if c.member not in old]
            old = set()
        keys = [(c.timer.tenant, c.timer.id) for c in cards if c.member in old]
        found = self.deps.timers.get_many(keys) if keys else {}
        jobs, gone = [], []
        for card in cards:
            if card.member in old:
                stored = found.get((card.timer.tenant, card.timer.id))
                if stored is None or stored.rev != card.timer.rev:
                    gone.append(card)  # the current revision is restored from its listing
                    continue
                card = replace(card, timer=stored)
            fresh = card.timer.status == "active"
            grace = misfire_grace_ms(card.timer)  # a fire within its window is on time
            decided = (
                step(card.timer, card.pos, card.n, max(now, card.pos), grace) if fresh else None
            )
            jobs.append(Job(card, fresh, decided))
        if gone:
            self.report.stale += len(gone)
            self._drop(gone)
        return jobs

    def _release(self, scores: Mapping[Card, int]) -> None:
        self.deps.index.release(self.bucket, scores)
        for card in scores:
            self.held.pop(card.member, None)

    def _drop(self, cards: Sequence[Card]) -> None:
        """Stale cards leave Redis (a newer revision's own card, if any, is newer: kept)."""
        earliest = self.deps.index.settle(self.bucket, [(c, None, c.timer.rev) for c in cards])
        self.next_due = _earliest(self.next_due, earliest)
        for card in cards:
            self.held.pop(card.member, None)

    # ------------------------------------------------------------ send, record, settle

    def _send_due(self) -> bool:
        lower = self.sync.lower()
        due = [j for j in self.pending if j.send_at + SEND_GUARD_MS <= lower]
        self.sender.send([j.delivery for j in due if j.delivery is not None])
        self.report.ambiguous = self.sender.ambiguous
        self._hook("sent")
        sent = [j for j in due if j.delivery is not None and j.delivery.settled]
        done = {id(j) for j in sent}
        self.pending = [j for j in self.pending if id(j) not in done]
        self._finish(self._record(sent))
        return bool(sent)

    def _record(self, jobs: Sequence[Job]) -> list[Job]:
        """Record each sent job's outcome; returns the jobs recorded as ours."""
        outcomes: dict[str, dict[str, Entry]] = defaultdict(dict)
        by_ref: dict[EntryRef, Job] = {}
        for job in jobs:
            d = job.delivery
            assert d is not None and job.entry is not None
            state: State = "d" if d.enqueued_ms is not None else "f"
            at = d.enqueued_ms if d.enqueued_ms is not None else self.sync.now()
            outcomes[job.ref[0]][job.name] = replace(
                job.entry,
                state=state,
                owner=None,
                until=None,
                enqueued=at,
                reason=d.failure,
                hook=job.timer.webhook is not None,
            )
            by_ref[job.ref] = job
            if d.enqueued_ms is not None:
                self.report.enqueued += 1
                # late past the window's end (on the dot: past the due time)
                self.report.lags_ms.append(lateness_ms(d.fired_ms - d.fire_ms, job.timer.window_ms))
            else:
                self.report.failed += 1
                self.report.failures.append(f"{d.id}: {d.failure}")
        recorded = self._write_back(outcomes, by_ref)
        self._hook("recorded")
        self._counts(recorded)
        return recorded

    def _counts(self, recorded: Sequence[Job]) -> None:
        """Add what this run just recorded (sent, failed, skipped) to its tenants' usage, one
        ADD per tenant and month, on the sandbox's usage writer: never on a fire's way, and
        lost only by a run that dies in that write. A chain ended at its card's revision stops
        being active; one a change adopted (its revision on the entry) was counted by it."""
        usage = self.deps.usage
        rows = [
            (
                job.timer.tenant,
                job.fire_ms,
                e.enqueued or self.sync.now(),
                e.state,
                e.end and e.rev == job.timer.rev,
                job.timer.window_ms,
            )
            for job in recorded
            if (e := job.entry) is not None and e.state in FINISHED
        ]
        if usage is not None and rows:
            self.counting.append(USAGE_WRITER.submit(count_fires, usage, rows, self.bucket))

    def _counted(self) -> None:
        """Wait for this run's usage writes while its invocation has time left."""
        wait(self.counting, timeout=max(0, self._left() - TAIL_MS) / 1000)

    def _write_back(
        self,
        outcomes: Mapping[str, Mapping[str, Entry]],
        jobs: Mapping[EntryRef, Job],
        release: bool = False,
    ) -> list[Job]:
        """Write our entries (outcomes, or released claims): every chunk of every item in
        parallel - one record's worst case for all, as a send reserved (an item's chunks too:
        their conditions name their own entries) - each retried while the deadline allows; a
        chunk that fails its condition (a change adopted an entry) is written entry by entry,
        merging the adoption. What finds no time stays pending: its claim lapses, and a
        takeover sends it again (for a sent fire: the duplicate window)."""
        units = [(key, chunk) for key, entries in outcomes.items() for chunk in chunks(entries)]
        if not units:
            return []
        # All start now: one look at the deadline for every first try (a thread that starts
        # late in the pool has not waited for the others' calls).
        started = self._affords(DYNAMO_CALL_MS if release else RECORD_CALL_MS)
        with ThreadPoolExecutor(max(1, min(RECORD_WORKERS, len(units)))) as pool:
            written = list(
                pool.map(lambda u: self._write_item(u[0], u[1], release, started), units)
            )
        done: list[Job] = []
        for (key, _), entries in zip(units, written, strict=True):
            for name, entry in entries.items():
                job = jobs[(key, name)]
                job.entry = entry
                done.append(job)
        return done

    def _write_item(
        self, key: str, entries: Mapping[str, Entry], release: bool, started: bool = False
    ) -> dict[str, Entry]:
        written: dict[str, Entry] = {}
        fire_log = self.deps.log
        budget = DYNAMO_CALL_MS if release else RECORD_CALL_MS
        try:
            for chunk in chunks(entries):
                write = (fire_log.record, key, self.owner, chunk, release)
                if self._retried(budget, *write, started=started):
                    written.update(chunk)
                    continue
                for name, mine in chunk.items():  # a change adopted one: merged one by one
                    rewrite = (fire_log.rewrite, key, name, self.owner, mine, 1, release)
                    merged = self._retried(DYNAMO_CALL_MS + budget, *rewrite)
                    if merged is not None:
                        written[name] = merged
                    elif mine.state != "p":
                        self.report.unrecorded += 1  # taken over: sent again
        except OutOfTime:
            unwritten = [e for name, e in entries.items() if name not in written]
            self.report.unrecorded += sum(e.state != "p" for e in unwritten)  # sent again
            log.warning("out of time for records", extra={"unwritten": len(unwritten)})
        return written

    def _retried(
        self, budget: int, write: Callable[..., T], *args: Any, started: bool = False
    ) -> T:
        """A record write, tried while each try (its worst case ``budget``) fits - the first
        without a look if the caller found it fits (``started``)."""
        while True:
            if not started and not self._affords(budget):
                raise OutOfTime("no time left for a record")
            started = False
            try:
                return write(*args)
            except (BotoCoreError, ClientError):
                log.warning("record failed; retrying", exc_info=True)

    def _finish(self, jobs: Sequence[Job]) -> None:
        """Move checkpoints where needed (in parallel, each only if it fits the deadline), then
        settle each card: chained to its successor if due within the hold, else dropped. A
        position chains only under the revision that owns its entry, while that revision is the
        timer's and the timer is active. A card whose owner or checkpoint finds no time goes
        back as it is: the next run finds its fire recorded and only chains it."""
        if not jobs:
            return
        now = self.sync.now()
        nexts: list[Onward] = []
        unfinished: dict[Card, int] = {}
        for job in jobs:
            if not self._owner_known(job):
                unfinished[job.card] = job.card.due_at
                continue
            timer = self._owner_of(job)
            following = None if timer is None else successor(job.done, job.card.pos, timer.plan)
            chained = following is not None and following <= now + self._hold_ms
            nexts.append(Onward(job, timer, following, chained))
        written = self._checkpoints([o for o in nexts if o.needs_checkpoint], now)
        moves: list[tuple[Card, Card | None, int]] = []
        ended: set[str] = set()  # chains done at their revision: the migrator learns it from Redis
        for o in nexts:
            card, entry = o.job.card, o.job.done
            if written.get(card) is False:
                unfinished[card] = card.due_at
                continue
            self.report.skipped += entry.state == "k"
            ckpt = o.following if written.get(card) and o.following else card.ckpt
            nxt = None
            if o.timer and o.following and o.chained:
                nxt = Card(o.timer, o.following, entry.n, card.pos, ckpt)
            moves.append((card, nxt, entry.rev))
            if o.timer and o.following is None:
                ended.add(card.member)
        self._hook("checkpointed")
        earliest = self.deps.index.settle(self.bucket, moves, ended, now)
        for card, _, _ in moves:
            self.held.pop(card.member, None)
        self.next_due = _earliest(self.next_due, earliest)
        if unfinished:
            self._release(unfinished)
        self._hook("finished")

    def _checkpoints(self, steps: Sequence[Onward], now: int) -> dict[Card, bool]:
        """Move each checkpoint to its successor (a listing, then the timer: R3, R4) or complete
        its timer; in parallel, each only if it fits the deadline. Card -> whether it was
        written (False: failed, or no time; the card goes back as it is)."""

        def write(o: Onward) -> bool:
            assert o.timer is not None
            if not self._affords(CHECKPOINT_CALL_MS):
                return False
            job = o.job
            try:
                if o.following is None:
                    expires = now + self.deps.retention_ms
                    self.deps.checkpoints.complete(o.timer, job.done.n, job.card.pos, expires)
                else:
                    self.deps.checkpoints.move(o.timer, o.following, job.done.n, job.card.pos)
            except (BotoCoreError, ClientError, PynamoDBException):
                log.warning("checkpoint failed; its card goes back", exc_info=True)
                return False
            return True

        if not steps:
            return {}
        with ThreadPoolExecutor(max(1, min(ITEM_WORKERS, len(steps)))) as pool:
            return dict(zip((o.job.card for o in steps), pool.map(write, steps), strict=True))

    def _owner_known(self, job: Job) -> bool:
        """Whether the timer owning the job's entry is at hand, or may be read in time."""
        return job.done.rev <= job.timer.rev or self._affords(DYNAMO_CALL_MS)

    def _owner_of(self, job: Job) -> Timer | None:
        """The timer at its entry's revision, if current and active (read once if the entry is
        newer than the card: a change adopted it)."""
        assert job.entry is not None
        rev, timer = job.entry.rev, job.timer
        if rev > timer.rev:
            timer = self.deps.timers.get_many([(timer.tenant, timer.id)]).get(
                (timer.tenant, timer.id), timer
            )
        return timer if timer.rev == rev and timer.status == "active" else None

    def _hand_back(self) -> None:
        """Give back what this run will not finish: its claims released (valid until 0: the
        next run takes them over at once, keeping each decision), its cards due at once."""
        unsent, self.pending = self.pending, []
        try:  # each release only if it fits the deadline: else the claim lapses with it
            released: dict[str, dict[str, Entry]] = defaultdict(dict)
            for job in unsent:
                released[job.ref[0]][job.name] = replace(job.done, until=0)
            self._write_back(released, {job.ref: job for job in unsent}, release=True)
        except Exception:  # the claims lapse at the deadline instead
            log.exception("hand-back failed; claims will lapse")
        while self.held and self._affords(REDIS_CALL_MS):
            try:
                self.deps.index.release(self.bucket, {c: c.due_at for c in self.held.values()})
                self.report.handed_back += len(self.held)
                self.held = {}
            except Exception:  # a failover: its replica takes over in seconds, not a lease
                if not self._affords(REDIS_CALL_MS + HAND_BACK_RETRY_MS):
                    log.exception("hand-back failed; leases will end at the deadline")
                    return
                log.warning("hand-back failed; retrying", exc_info=True)
                self.deps.sleep(HAND_BACK_RETRY_MS / 1000)


USAGE_WRITER = ThreadPoolExecutor(1, thread_name_prefix="usage")
"""The sandbox's usage counter writes, in order, off the runs' threads."""


def drain_usage() -> None:
    """Wait for every usage write submitted so far (tests)."""
    USAGE_WRITER.submit(lambda: None).result()


def _earliest(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)

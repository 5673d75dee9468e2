"""The send and the record: a run's claimed fires sent once due (``timers.engine.callbacks``), their
outcomes recorded in the fire log, checkpoints moved where a chain needs it, and what was
recorded counted in the tenants' usage (R3, R5 and "Within the function's timeout" in
docs/fire-path.md)."""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, TypeVar

from botocore.exceptions import BotoCoreError, ClientError
from pynamodb.exceptions import PynamoDBException

from timers.core.clock import ClockSync
from timers.core.lag import lateness_ms
from timers.core.schedule import is_recurring
from timers.core.timer import Timer
from timers.engine.callbacks import Sender, SqsPort
from timers.engine.claim import DYNAMO_CALL_MS, ITEM_WORKERS, Job
from timers.engine.entries import Entry, EntryRef, State, hold_ms, needs_checkpoint, successor
from timers.engine.index import Card
from timers.engine.log import chunks
from timers.tenancy.usage import FINISHED, count_fires

if TYPE_CHECKING:
    from timers.engine.trigger import Hook, TriggerDeps, TriggerReport

log = logging.getLogger(__name__)
T = TypeVar("T")

SQS_CALL_MS = 9_000  # of one SendMessageBatch attempt: 1 s connect + 8 s read
RECORD_CALL_MS = 8_500  # of one record attempt: 0.5 s connect + 8 s read
CHECKPOINT_CALL_MS = 2 * DYNAMO_CALL_MS  # a checkpoint's move: its listing, then the timer
RECORD_WORKERS = 16  # record writes in parallel: the DynamoDB clients' connection pool

Move = tuple[Card, Card | None, int]  # a leased card, its successor (None: dropped), its rev

USAGE_WRITER = ThreadPoolExecutor(1, thread_name_prefix="usage")
"""The sandbox's usage counter writes, in order, off the runs' threads."""


def drain_usage() -> None:
    """Wait for every usage write submitted so far (tests)."""
    USAGE_WRITER.submit(lambda: None).result()


class UsagePort(Protocol):
    def add(
        self, tenant: str, month: str, counts: Mapping[str, int], shard: int | None = None
    ) -> None: ...


class Timed:
    """The SQS client, each SendMessageBatch's time told to ``took`` (the run's pace)."""

    def __init__(self, sqs: SqsPort, now: Callable[[], int], took: Callable[[int], None]) -> None:
        self.sqs, self.now, self.took = sqs, now, took

    def send_message_batch(self, *, QueueUrl: str, Entries: Sequence[Any]) -> Any:
        began = self.now()
        try:
            return self.sqs.send_message_batch(QueueUrl=QueueUrl, Entries=Entries)
        finally:
            self.took(self.now() - began)


class OutOfTime(Exception):
    """A call the run's deadline leaves no room for: not started."""


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


@dataclass
class Recorder:
    """A run's fires from their claim on: sent, recorded, checkpointed and counted, each call
    started only if ``affords`` says its worst case ends before the run's deadline."""

    deps: TriggerDeps
    owner: str
    sync: ClockSync
    report: TriggerReport
    sender: Sender
    affords: Callable[[int], bool]
    hook: Callable[[Hook], None]
    counting: list[Future[None]] = field(default_factory=list)  # its usage writes (USAGE_WRITER)

    def send(self, due: Sequence[Job]) -> list[Job]:
        """Send the due jobs; returns those settled (sent, or failed for good)."""
        self.sender.send([j.delivery for j in due if j.delivery is not None])
        self.report.ambiguous = self.sender.ambiguous
        self.hook("sent")
        return [j for j in due if j.delivery is not None and j.delivery.settled]

    def record(self, jobs: Sequence[Job]) -> list[Job]:
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
        self.hook("recorded")
        self.count(recorded)
        return recorded

    def count(self, recorded: Sequence[Job]) -> None:
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
            self.counting.append(USAGE_WRITER.submit(count_fires, usage, rows, self.report.bucket))

    def release(self, unsent: Sequence[Job]) -> None:
        """Give the claims back (valid until 0: the next run takes them over at once, keeping
        each decision), each only if it fits the deadline: else the claim lapses with it."""
        try:
            released: dict[str, dict[str, Entry]] = defaultdict(dict)
            for job in unsent:
                released[job.ref[0]][job.name] = replace(job.done, until=0)
            self._write_back(released, {job.ref: job for job in unsent}, release=True)
        except Exception:  # the claims lapse at the deadline instead
            log.exception("hand-back failed; claims will lapse")

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
        started = self.affords(DYNAMO_CALL_MS if release else RECORD_CALL_MS)
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
            if not started and not self.affords(budget):
                raise OutOfTime("no time left for a record")
            started = False
            try:
                return write(*args)
            except (BotoCoreError, ClientError):
                log.warning("record failed; retrying", exc_info=True)

    def checkpoint(
        self, jobs: Sequence[Job], now: int
    ) -> tuple[list[Move], set[str], dict[Card, int]]:
        """Move checkpoints where needed (in parallel, each only if it fits the deadline), and
        say how each card settles: chained to its successor if due within the hold, else
        dropped. A position chains only under the revision that owns its entry, while that
        revision is the timer's and the timer is active. Returns the moves, the members whose
        chain ended at their revision, and the cards whose owner or checkpoint found no time:
        back as they are (the next run finds their fires recorded and only chains them)."""
        hold = hold_ms(self.deps.lookahead_ms, self.deps.retention_ms)  # chained this soon
        nexts: list[Onward] = []
        unfinished: dict[Card, int] = {}
        for job in jobs:
            if not self._owner_known(job):
                unfinished[job.card] = job.card.due_at
                continue
            timer = self._owner_of(job)
            following = None if timer is None else successor(job.done, job.card.pos, timer.plan)
            chained = following is not None and following <= now + hold
            nexts.append(Onward(job, timer, following, chained))
        written = self._checkpoints([o for o in nexts if o.needs_checkpoint], now)
        moves: list[Move] = []
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
        return moves, ended, unfinished

    def _checkpoints(self, steps: Sequence[Onward], now: int) -> dict[Card, bool]:
        """Move each checkpoint to its successor (a listing, then the timer: R3, R4) or complete
        its timer; in parallel, each only if it fits the deadline. Card -> whether it was
        written (False: failed, or no time; the card goes back as it is)."""

        def write(o: Onward) -> bool:
            assert o.timer is not None
            if not self.affords(CHECKPOINT_CALL_MS):
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
        return job.done.rev <= job.timer.rev or self.affords(DYNAMO_CALL_MS)

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

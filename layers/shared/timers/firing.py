"""The trigger: fire one bucket's due positions on time, once, and never early.

A run is *armed*: it leases what falls due within ARM_MS, claims it while it is still in the
future (one conditional write per claim item and chunk), waits for each due instant by the
reference clock, sends, records, checkpoints where needed, and finishes in Redis (ack and
chain the next position). It loops until nothing of its bucket is due within ARM_MS.
See docs/fire-path.md.

What a crash at each step leaves behind (``hooks`` lets tests crash there), and who finishes it:

============  ==============================================================================
step          after a crash here, once the run's lease lapses (its deadline + ~3 s) ...
============  ==============================================================================
leased        ... a run leases the members again and does everything: nothing was sent.
claimed       ... a run takes the lapsed claims over and sends: nothing was sent before.
sent          ... a run takes the lapsed claims over and sends AGAIN: the duplicate window.
recorded      ... a run finds the fires recorded, checkpoints and chains: no re-send.
checkpointed  ... the same; the checkpoint write is repeated (it is idempotent).
finished      ... nothing is left: Redis was acked and chained.
============  ==============================================================================

**Never early.** A send starts only when the lower bound of the reference time (Redis ``TIME``,
measured against this host's monotonic clock at every lease, so a step of the wall clock moves
nothing) has reached the occurrence plus SEND_GUARD_MS. Without a trusted offset the run sends
nothing.

**Deadline-aware.** No lease, claim or send attempt starts unless, by the client timeouts,
it and everything after it end before the invocation's deadline; the claims hold until that
deadline and the Redis leases a little longer. What a run will not finish it hands back at
once (its claims released to the next run, its members to due), so duplicates need a crash or
an SQS call that timed out after SQS accepted it. The claim phase is ``timers.claiming``.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol, TypeVar

from botocore.exceptions import BotoCoreError, ClientError

from timers.adapters.claims import ClaimStore, chunks
from timers.adapters.redis_index import Leased
from timers.claiming import Claimer, Job
from timers.core.chain import (
    LAPSE_MARGIN_MS,
    Entry,
    Member,
    State,
    hold_ms,
    needs_checkpoint,
    next_member,
    step,
)
from timers.core.schedule import is_recurring
from timers.core.timer import Timer, from_card
from timers.sending import Delivery, Sender, SqsPort

log = logging.getLogger(__name__)
T = TypeVar("T")

# ---------------------------------------------------------------- tuning, and why

ARM_MS = 250
"""A run leases and claims what falls due this far ahead, then waits to send it: the claim
(one DynamoDB write, ~10 ms) is done before the due instant, so only the send remains."""

LEASE_LIMIT = 100
"""Members per lease: at most two claim writes per claim item (CHUNK), made in parallel, so
the first send never waits for more than one round of claims."""

SEND_FIRST_MS = 20
"""A run leases more while it waits for its next send, unless that send is this close: then it
sends first (a lease and a claim take ~10-20 ms)."""

SEND_GUARD_MS = 1
"""Sent only when the reference time's lower bound is this far past the due time."""

MAX_CLOCK_OFFSET_MS = 2_000
"""A host clock further than this from the reference is broken, not merely skewed: refuse."""

MAX_CLOCK_ERROR_MS = 100
"""The offset is only as good as half the round trip that measured it: beyond this, refuse."""

CLOCK_RESYNC_MS = 5_000
"""Measure the offset again when the last measure is older than this."""

REDIS_CALL_MS = 1_000
"""Worst case of one Redis call (the client's socket timeout, see timers.runtime)."""

DYNAMO_CALL_MS = 3_500
"""Worst case of one DynamoDB claim or read: 0.5 s connect + 3 s read (the handler's client)."""

RECORD_CALL_MS = 8_500
"""Worst case of one record attempt: 0.5 s connect + 8 s read (the handler's record client)."""

SQS_CALL_MS = 9_000
"""Worst case of one SendMessageBatch attempt: 1 s connect + 8 s read (the handler's client).
The read timeout is long on purpose: a batch that times out after SQS took it is sent again (a
duplicate), so only a dead connection, not a slow answer, should end the wait."""

SEND_RESERVE_MS = SQS_CALL_MS + RECORD_CALL_MS + 2 * REDIS_CALL_MS
"""A send attempt starts only with this much time left: it, its record and its finish."""

STOP_LEASING_MS = 15_000
"""A run takes no new work after this long, so the fan-out can re-spread a long backlog."""

LEASE_GRACE_MS = LAPSE_MARGIN_MS + 1_000
"""A Redis lease outlives the run's claims (and their lapse margin): it expires only under a
run that is gone, and the run that reclaims it can take the claims over at once."""

Hook = Literal["leased", "claimed", "sent", "recorded", "checkpointed", "finished"]
HOOKS: tuple[Hook, ...] = ("leased", "claimed", "sent", "recorded", "checkpointed", "finished")

ON_TIME_MS = 100
LAG_BUCKETS: tuple[tuple[int, str], ...] = (
    (ON_TIME_MS, "on_time"),
    (200, "le_200ms"),
    (600, "le_600ms"),
    (1_000, "le_1s"),
    (2_000, "le_2s"),
)
LAG_OVER = "gt_2s"


def lag_bucket(lag_ms: int) -> str:
    """Accuracy bucket of one fire's lag (fired_at - scheduled_at) for the metrics."""
    for limit, name in LAG_BUCKETS:
        if lag_ms <= limit:
            return name
    return LAG_OVER


# ---------------------------------------------------------------- ports


class TriggerIndex(Protocol):
    """The Redis index operations a trigger uses (timers.adapters.redis_index.RedisIndex)."""

    def lease(
        self,
        bucket: int,
        *,
        now_ms: int,
        until_ms: int,
        deadline_ms: int,
        limit: int,
        owner: str,
        scan: int | None = None,
    ) -> Leased: ...
    def finish(
        self, bucket: int, owner: str, now_ms: int, done: Sequence[tuple[Member, Member | None]]
    ) -> int | None: ...
    def release(self, bucket: int, owner: str, members: Mapping[Member, int]) -> int: ...
    def hint(self, bucket: int, due_ms: int) -> None: ...
    def rehint(self, bucket: int) -> int | None: ...
    def touch_run(self, bucket: int, slot: int, token: str, ttl_ms: int) -> bool: ...
    def end_run(self, bucket: int, slot: int, token: str) -> bool: ...


class TimerPort(Protocol):
    """The timers-table operations a trigger uses (timers.adapters.timers_table.TimerStore)."""

    def get_many(
        self, keys: Iterable[tuple[str, str]], consistent: bool = True
    ) -> dict[tuple[str, str], Timer]: ...
    def checkpoint(self, timer: Timer, pos: int | None, n: int, last: int | None) -> bool: ...
    def complete(self, timer: Timer, n: int, last: int | None, expires_ms: int) -> bool: ...


@dataclass
class TriggerDeps:
    """Everything with a side effect, injected: built once per cold start by the handler."""

    index: TriggerIndex
    claims: ClaimStore
    timers: TimerPort
    sqs: SqsPort
    clock: Callable[[], int]  # this host's clock, epoch ms
    reference: Callable[[], int]  # the reference clock (Redis TIME), epoch ms
    lookahead_ms: int  # a next position due within this goes straight back into Redis
    retention_ms: int  # how long a completed timer stays readable
    sleep: Callable[[float], None] = time.sleep
    hooks: Callable[[Hook], None] | None = None  # crash seams for tests
    new_owner: Callable[[], str] = field(default=lambda: uuid.uuid4().hex[:12])
    lease_limit: int = LEASE_LIMIT
    delivery_queue_url: str = ""  # HTTP targets' fires are sent here (the delivery function)
    monotonic: Callable[[], int] | None = None  # elapsed time, ms (default: ``clock``)


@dataclass
class TriggerReport:
    """What one run did."""

    bucket: int
    leases: int = 0
    leased: int = 0
    reclaimed: int = 0  # expired leases of dead runs put back by this run's lease calls
    stale: int = 0  # dropped: an older revision, or the timer is gone or not active
    skipped: int = 0  # positions the misfire policy skipped
    already_fired: int = 0  # the claim found the position finished: only chained
    held: int = 0  # another run's live claim: deferred until it lapses
    enqueued: int = 0
    failed: int = 0
    handed_back: int = 0  # leased or claimed, then given back (deadline)
    taken_over: int = 0  # lapsed claims of dead runs taken over: maybe sent once already
    refused: int = 0  # not sent: the clock could not be trusted
    ambiguous: int = 0  # send attempts that timed out after the request went: maybe sent twice
    unrecorded: int = 0  # sent, and not recorded as ours (failed until the deadline, or the
    # claim lapsed and was taken over): sent again by the run that finishes it
    lags_ms: list[int] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)  # "<fire id>: <reason>"

    def lag_buckets(self) -> Counter[str]:
        return Counter(lag_bucket(lag) for lag in self.lags_ms)

    def summary(self) -> dict[str, int]:
        return {
            name: value
            for name, value in vars(self).items()
            if isinstance(value, int) and not isinstance(value, bool)
        }


# ---------------------------------------------------------------- the clock


class ClockSync:
    """The reference time (Redis TIME), kept between measures by this host's monotonic clock.

    The offset is measured as ``reference - midpoint`` of two local reads around one reference
    read; its error is half that round trip (plus the reference's 1 ms resolution). Elapsed time
    comes from the monotonic clock, so a step of the host's wall clock between measures cannot
    move the lower bound; the wall clock is only checked against the reference at each measure
    (a host that far off is broken, not merely skewed).
    """

    def __init__(
        self,
        clock: Callable[[], int],
        reference: Callable[[], int],
        monotonic: Callable[[], int] | None = None,
    ) -> None:
        self._wall = clock
        self._clock = monotonic or clock
        self._reference = reference
        self.offset: int | None = None  # reference - monotonic
        self.wall_offset: int | None = None  # reference - wall clock, at the last measure
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
        """Best estimate of the reference time."""
        return self._clock() + (self.offset or 0)

    def lower(self) -> int:
        """A time the reference has certainly reached."""
        return self.now() - self.error

    def stale(self) -> bool:
        return self._clock() - self.measured_at > CLOCK_RESYNC_MS


# ---------------------------------------------------------------- a run


@dataclass(frozen=True)
class RunMarker:
    """The fan-out's mark that this run was started: (slot, token)."""

    slot: int
    token: str


def run_trigger(
    deps: TriggerDeps, bucket: int, remaining_ms: int, marker: RunMarker | None = None
) -> TriggerReport:
    """Fire the bucket's positions due within ARM_MS, and keep going while more fall due.

    With the fan-out's ``marker``, the run keeps its bucket slot marked while it goes, clears it
    when it ends and then re-hints the bucket, so whatever was added meanwhile is dispatched.
    """
    if marker is not None:
        deps.index.touch_run(bucket, marker.slot, marker.token, remaining_ms + LEASE_GRACE_MS)

    def ended() -> None:  # not on a kill (BaseException in tests): a killed run does nothing
        if marker is not None:
            deps.index.end_run(bucket, marker.slot, marker.token)
        deps.index.rehint(bucket)

    run = Run(deps, bucket, remaining_ms)
    try:
        report = run.go()
    except Exception:
        log.exception("trigger run failed", extra=run.report.summary())  # unrecorded included
        ended()
        raise
    ended()
    return report


class Run:
    def __init__(self, deps: TriggerDeps, bucket: int, remaining_ms: int) -> None:
        self.deps = deps
        self.bucket = bucket
        self.report = TriggerReport(bucket)
        self.owner = deps.new_owner()
        self.sync = ClockSync(deps.clock, deps.reference, deps.monotonic)
        self.sync.measure()
        self.started = self.sync.now()
        self.end = self.started + remaining_ms  # the invocation's hard end, reference time
        self.pending: list[Job] = []  # claimed, waiting for their send instant
        self.next_due: int | None = None  # when the bucket next has something to lease
        self.held_leases: dict[Member, int] = {}  # leased and not yet finished: due times
        self.sender = Sender(
            deps.sqs,
            self.sync.now,
            deps.sleep,
            self._may_send,
            delivery_queue_url=deps.delivery_queue_url,
        )
        self._hook = deps.hooks or (lambda _: None)
        self._hold_ms = hold_ms(deps.lookahead_ms, deps.retention_ms)

    # ------------------------------------------------------------ loop

    def go(self) -> TriggerReport:
        if not self.sync.trusted:
            log.error("clock not trusted; not firing", extra=self._clock_state())
            self.report.refused += 1
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
                self._wait_until(wake)
        except Exception:
            self._hand_back()
            raise
        self._hand_back()  # (a kill - BaseException in tests - hands back nothing, as in Lambda)
        return self.report

    def _sendable(self) -> bool:
        return bool(self.pending) and (self.sync.lower() >= self.pending[0].send_at + SEND_GUARD_MS)

    def _wait_until(self, at_ms: int) -> None:
        """Sleep until the reference time has surely reached ``at_ms``."""
        while (left := at_ms - self.sync.lower()) > 0:
            self.deps.sleep(left / 1000)

    # ------------------------------------------------------------ budgets

    def _left(self) -> int:
        return self.end - self.sync.now()

    def _may_lease(self, now: int) -> bool:
        work = REDIS_CALL_MS + DYNAMO_CALL_MS + SEND_RESERVE_MS
        return now - self.started < STOP_LEASING_MS and self._left() > work

    def _may_claim(self) -> bool:
        return self._left() > DYNAMO_CALL_MS + SEND_RESERVE_MS

    def _may_send(self, deliveries: Sequence[Delivery]) -> bool:
        """A send attempt starts only if it, its record and its finish end before the deadline,
        and only when every fire in it is due by the lower bound of the reference time."""
        if self._left() <= SEND_RESERVE_MS:
            return False
        if self.sync.stale():
            self.sync.measure()
        if not self.sync.trusted:
            self.report.refused += 1
            return False
        latest = max((d.fire_ms for d in deliveries), default=0)  # >= each position
        return self.sync.lower() >= latest + SEND_GUARD_MS

    # ------------------------------------------------------------ lease, triage, claim

    def _lease_and_claim(self) -> int | None:
        """Lease what falls due within ARM_MS, claim it; returns when the bucket next has
        something to lease (from the lease, or from what finishing chained)."""
        self.next_due = None
        self.sync.measure()
        if not self.sync.trusted:
            self.report.refused += 1
            return None
        now = self.sync.now()
        leased = self.deps.index.lease(
            self.bucket,
            now_ms=now,
            until_ms=now + ARM_MS,
            deadline_ms=self.end + LEASE_GRACE_MS,
            limit=self.deps.lease_limit,
            owner=self.owner,
        )
        self.report.leases += 1
        self.report.leased += len(leased.members)
        self.report.reclaimed += leased.reclaimed
        for m in leased.members:
            self.held_leases[m] = m.due
        self._hook("leased")
        jobs = self._triage(leased)
        if not self._may_claim():
            return leased.next_due  # the hand-back gives the leases back
        claimer = Claimer(self.deps.claims, self.owner, self.end, self.sync.now, self._may_claim)
        claimed = claimer.claim(jobs)
        self.report.taken_over += claimed.taken_over
        self.report.already_fired += claimed.already_fired
        self.report.handed_back += claimed.given_back
        if claimed.held:
            self.report.held += len(claimed.held) - claimed.given_back
            self._release(claimed.held)
        if claimed.stale:
            self.report.stale += len(claimed.stale)
            self._forget(claimed.stale)
        self._hook("claimed")
        firing = self._one_per_position(
            [j for j in claimed.ours if j.entry is not None and j.entry.state == "p"]
        )
        for job in firing:
            job.delivery = Delivery(job.timer, job.fire_ms, ref=job.ref)
        self.pending = sorted(self.pending + firing, key=lambda j: j.send_at)
        # skipped and already-fired positions need no send: finish them now
        self._finish([j for j in claimed.ours if j.entry is not None and j.entry.finished])
        return _earliest(leased.next_due, self.next_due)

    def _one_per_position(self, claimed: list[Job]) -> list[Job]:
        """Two members of one position (an old revision's, back from a dead run's lease, and
        the one the migrator put back) must not both send it: the second waits, and comes back
        to find the fire recorded (then only acknowledged, and chained if it is the head)."""
        held = {job.root for job in self.pending}
        firing, again = [], {}
        for job in claimed:
            if job.root in held:
                again[job.member] = self.sync.now() + ARM_MS + 1
            else:
                held.add(job.root)
                firing.append(job)
        if again:
            self.report.held += len(again)
            self._release(again)
        return firing

    def _triage(self, leased: Leased) -> list[Job]:
        """Pair each member with its timer (Redis' card, else one consistent read): a member of
        the timer's current revision, the timer active, is *fresh* and decided now; any other
        only takes over, waits for or acknowledges a claim (R2). A member whose timer is gone
        is dropped. A member overdue by more than half the retention is checked against
        DynamoDB, not its card: a change whose Redis update failed left its card and member
        behind, and the fence that stops them expires with its claim item (retention)."""
        trusted_since = self.sync.now() - self.deps.retention_ms // 2
        distrusted = {m.timer_id for m in leased.members if m.due < trusted_since}
        timers = {
            m.timer_id: from_card(m.tenant, m.timer_id, card)
            for m in leased.members
            if (card := leased.cards.get(m.timer_id))
            and int(card.split("|", 1)[0]) >= m.rev
            and m.timer_id not in distrusted
        }
        missing = [m for m in leased.members if m.timer_id not in timers]
        if missing:
            read = self.deps.timers.get_many((m.tenant, m.timer_id) for m in missing)
            timers.update({t.id: t for t in read.values()})
        jobs, gone = [], []
        now = self.sync.now()
        newest: dict[tuple[str, int], Member] = {}  # one job per position: the newest member
        for m in leased.members:
            key = (m.timer_id, m.due)
            if key not in newest or newest[key].rev < m.rev:
                newest[key] = m
        for m in leased.members:
            timer = timers.get(m.timer_id)
            if timer is None or newest[(m.timer_id, m.due)] is not m:
                gone.append(m)
                continue
            fresh = timer.rev == m.rev and timer.status == "active"
            decided = step(timer, m, max(now, m.due)) if fresh else None
            jobs.append(Job(m, timer, fresh, decided))
        if gone:
            self.report.stale += len(gone)
            self._forget(gone)
        return jobs

    def _release(self, members: Mapping[Member, int]) -> None:
        """Give leased members back to due, each leasable from its score."""
        self.deps.index.release(self.bucket, self.owner, members)
        for m in members:
            self.held_leases.pop(m, None)

    # ------------------------------------------------------------ send, record, finish

    def _send_due(self) -> bool:
        """Send what is due; False if nothing could be sent (refused)."""
        lower = self.sync.lower()
        due = [j for j in self.pending if j.send_at + SEND_GUARD_MS <= lower]
        deliveries = [j.delivery for j in due if j.delivery is not None]
        self.sender.send(deliveries)
        self.report.ambiguous = self.sender.ambiguous
        self._hook("sent")
        sent = [j for j in due if j.delivery is not None and j.delivery.settled]
        sent_ids = {id(j) for j in sent}
        self.pending = [j for j in self.pending if id(j) not in sent_ids]
        self._finish(self._record(sent))
        return bool(sent)

    def _record(self, jobs: Sequence[Job]) -> list[Job]:
        """Record each sent job's outcome; returns the jobs recorded as ours (the others' claims
        lapsed and were taken over: the run that took them finishes them)."""
        outcomes: dict[str, dict[str, Entry]] = defaultdict(dict)
        by_name: dict[tuple[str, str], Job] = {}
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
            by_name[job.ref] = job
            if d.enqueued_ms is not None:
                self.report.enqueued += 1
                self.report.lags_ms.append(d.fired_ms - d.fire_ms)
            else:
                self.report.failed += 1
                self.report.failures.append(f"{d.id}: {d.failure}")
        recorded = self._write_back(outcomes, by_name)
        self._hook("recorded")
        return recorded

    def _write_back(
        self, outcomes: Mapping[str, Mapping[str, Entry]], jobs: Mapping[tuple[str, str], Job]
    ) -> list[Job]:
        """Write our claimed entries (outcomes, or released claims) a chunk per write, retried
        while the deadline leaves time for another attempt and a finish: a fire sent and not
        recorded is sent again once its claim lapses. A chunk that fails its condition (a
        change adopted one of its entries) is written entry by entry, merging the adoption."""
        done: list[Job] = []
        for key, entries in outcomes.items():
            for chunk in chunks(entries):
                if self._retried(self.deps.claims.record, key, self.owner, chunk):
                    written = chunk
                else:
                    written = {}
                    for name, mine in chunk.items():
                        merged = self._retried(
                            self.deps.claims.rewrite, key, name, self.owner, mine
                        )
                        if merged is None:
                            self.report.unrecorded += mine.state != "p"  # taken over: re-sent
                        else:
                            written[name] = merged
                for name, entry in written.items():
                    job = jobs[(key, name)]
                    job.entry = entry
                    done.append(job)
        return done

    def _retried(self, write: Callable[..., T], *args: Any) -> T:
        while True:
            try:
                return write(*args)
            except (BotoCoreError, ClientError):
                if self._left() <= RECORD_CALL_MS + 2 * REDIS_CALL_MS:
                    self.report.unrecorded += 1  # re-sent once its claim lapses
                    raise
                log.warning("record failed; retrying", exc_info=True)

    def _finish(self, jobs: Sequence[Job]) -> None:
        """Checkpoint the timers that need it, then ack and chain in Redis. A position chains
        its successor only under the revision that owns its entry, while that revision is the
        timer's and the timer is active: a change after it owns what comes next."""
        if not jobs:
            return
        now = self.sync.now()
        done: list[tuple[Member, Member | None]] = []
        for job in jobs:
            entry = job.entry
            assert entry is not None
            if entry.state == "k":
                self.report.skipped += 1
            timer = self._owner_of(job)
            following = None if timer is None else next_member(job.member, entry, timer.plan)
            chained = following is not None and following.due <= now + self._hold_ms
            if timer is not None and is_recurring(timer.schedule):
                if needs_checkpoint(entry, chained) and following is None:
                    self.deps.timers.complete(
                        timer, entry.n, job.member.due, now + self.deps.retention_ms
                    )
                elif needs_checkpoint(entry, chained):
                    assert following is not None
                    self.deps.timers.checkpoint(timer, following.due, following.n, following.pv)
            done.append((job.member, following if chained else None))
        self._hook("checkpointed")
        earliest = self.deps.index.finish(self.bucket, self.owner, now, done)
        for member, _ in done:
            self.held_leases.pop(member, None)
        if earliest is not None:  # a chained position may be due already (a timer behind)
            self.deps.index.hint(self.bucket, earliest)
            self.next_due = _earliest(self.next_due, earliest)
        self._hook("finished")

    def _owner_of(self, job: Job) -> Timer | None:
        """The timer at the revision of the job's entry, if that revision is current and the
        timer active (read once if the entry is newer than the run's card: a change adopted it)."""
        assert job.entry is not None
        rev, timer = job.entry.rev, job.timer
        if rev > timer.rev:
            found = self.deps.timers.get_many([(timer.tenant, timer.id)])
            timer = found.get((timer.tenant, timer.id), timer)
        return timer if timer.rev == rev and timer.status == "active" else None

    def _forget(self, members: Sequence[Member]) -> None:
        """Drop stale members from Redis (they never chain: a newer revision owns the timer)."""
        now = self.sync.now()
        earliest = self.deps.index.finish(
            self.bucket, self.owner, now, [(m, None) for m in members]
        )
        self.next_due = _earliest(self.next_due, earliest)  # a newer revision may be due
        for m in members:
            self.held_leases.pop(m, None)

    def _hand_back(self) -> None:
        """Give back what this run will not finish: its claims released (valid until 0, so
        the next run takes them over at once, keeping each decision), its members to due."""
        unsent = self.pending
        self.pending = []
        try:
            released: dict[str, dict[str, Entry]] = defaultdict(dict)
            for job in unsent:
                assert job.entry is not None
                released[job.ref[0]][job.name] = replace(job.entry, until=0)
            self._write_back(released, {job.ref: job for job in unsent})
            if self.held_leases:
                self.report.handed_back += len(self.held_leases)
                self.deps.index.release(self.bucket, self.owner, dict(self.held_leases))
                self.held_leases = {}
        except Exception:  # the leases and claims lapse at the deadline instead
            log.exception("hand-back failed; leases and claims will lapse")

    def _clock_state(self) -> dict[str, int | None]:
        return {"offset_ms": self.sync.wall_offset, "error_ms": self.sync.error}


def _earliest(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)

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
measured against this host's clock at every lease) has reached the occurrence plus
SEND_GUARD_MS. Without a trusted offset the run sends nothing.

**Deadline-aware.** No lease, claim or send attempt starts unless, by the client timeouts,
it and everything after it end before the invocation's deadline; the claims hold until that
deadline and the Redis leases a little longer. What a run will not finish it hands back at
once (its claim entries removed, its members released), so duplicates need a crash or an SQS
call that timed out after SQS accepted it.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Literal, Protocol

from botocore.exceptions import BotoCoreError, ClientError

from timers.adapters.claims import ClaimStore, chunks
from timers.adapters.redis_index import Leased
from timers.core.chain import (
    LAPSE_MARGIN_MS,
    Entry,
    Member,
    State,
    Step,
    entry_for,
    entry_ref,
    may_claim,
    needs_checkpoint,
    next_member,
    step,
)
from timers.core.schedule import is_recurring
from timers.core.timer import Timer, from_card
from timers.sending import Delivery, Sender, SqsPort

log = logging.getLogger(__name__)

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

CLAIM_ATTEMPTS = 3
"""Tries of one claim write (each up to DYNAMO_CALL_MS) before its members are given back."""

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
    refused: int = 0  # not sent: the clock could not be trusted
    ambiguous: int = 0  # send attempts that timed out after the request went: maybe sent twice
    unrecorded: int = 0  # sent, and the record failed until the deadline: sent again later
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
    """This host's clock, corrected by its offset from the reference (Redis TIME).

    The offset is measured as ``reference - midpoint`` of two local reads around one reference
    read; its error is half that round trip (plus the reference's 1 ms resolution).
    """

    def __init__(self, clock: Callable[[], int], reference: Callable[[], int]) -> None:
        self._clock = clock
        self._reference = reference
        self.offset: int | None = None
        self.error = 0
        self.measured_at = 0

    def measure(self) -> None:
        before = self._clock()
        ref = self._reference()
        after = self._clock()
        self.offset = ref - (before + after) // 2
        self.error = (after - before + 1) // 2 + 1
        self.measured_at = after

    @property
    def trusted(self) -> bool:
        return (
            self.offset is not None
            and abs(self.offset) <= MAX_CLOCK_OFFSET_MS
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


@dataclass
class Job:
    """One leased member on its way through the run."""

    member: Member
    timer: Timer
    decided: Step | None = None
    entry: Entry | None = None  # what holds the position: ours, or the one found
    delivery: Delivery | None = None

    @property
    def ref(self) -> tuple[str, str]:
        return entry_ref(self.timer.partition, self.timer.id, self.member.due)

    @property
    def send_at(self) -> int:
        """Never before the position nor before the occurrence it fires."""
        fired = self.decided.fire_ms if self.decided else None
        return max(self.member.due, fired or 0)


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
        self.sync = ClockSync(deps.clock, deps.reference)
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
        claimed = self._claim(jobs)
        self._hook("claimed")
        firing = [j for j in claimed if j.entry is not None and j.entry.state == "p"]
        for job in firing:
            assert job.decided is not None and job.decided.fire_ms is not None
            job.delivery = Delivery(job.timer, job.decided.fire_ms, ref=job.ref)
        self.pending = sorted(self.pending + firing, key=lambda j: j.send_at)
        # skipped and already-fired positions need no send: finish them now
        self._finish([j for j in claimed if j.entry is not None and j.entry.finished])
        return _earliest(leased.next_due, self.next_due)

    def _triage(self, leased: Leased) -> list[Job]:
        """Pair each member with its timer (Redis' card, else one consistent read); drop the
        stale ones; decide the rest."""
        timers = {
            m.timer_id: from_card(m.tenant, m.timer_id, card)
            for m in leased.members
            if (card := leased.cards.get(m.timer_id)) and int(card.split("|", 1)[0]) >= m.rev
        }
        missing = [m for m in leased.members if m.timer_id not in timers]
        if missing:
            read = self.deps.timers.get_many((m.tenant, m.timer_id) for m in missing)
            timers.update({t.id: t for t in read.values()})
        jobs, stale = [], []
        now = self.sync.now()
        for m in leased.members:
            timer = timers.get(m.timer_id)
            if timer is None or timer.rev != m.rev or timer.status != "active":
                stale.append(m)
                continue
            jobs.append(Job(m, timer, decided=step(timer, m, max(now, m.due))))
        if stale:
            self.report.stale += len(stale)
            self._forget(stale)
        return jobs

    def _claim(self, jobs: Sequence[Job]) -> list[Job]:
        """Claim every job's position; returns the jobs whose position is ours to send or
        already finished. Others are deferred (held) or dropped (stale)."""
        until = self.end
        for job in jobs:
            assert job.decided is not None
            job.entry = entry_for(job.decided, job.member, self.owner, until)
        by_key: dict[str, dict[str, Job]] = defaultdict(dict)
        for job in jobs:
            by_key[job.ref[0]][job.ref[1]] = job
        # Claim items in parallel; the chunks of one item in turn (writes to one item serialize
        # anyway, and a conditional write that fails costs the item's size).
        with ThreadPoolExecutor(max(1, min(8, len(by_key)))) as pool:
            results = list(pool.map(lambda k: self._claim_item(k, by_key[k]), by_key))
        return [job for ours in results for job in ours]

    def _claim_item(self, key: str, named: dict[str, Job]) -> list[Job]:
        ours: list[Job] = []
        for chunk in chunks(named):
            for attempt in range(CLAIM_ATTEMPTS):
                try:  # a claim applied despite the error is found again as ours (same owner)
                    ours += self._claim_chunk(key, chunk)
                    break
                except (BotoCoreError, ClientError):
                    if attempt + 1 < CLAIM_ATTEMPTS and self._may_claim():
                        log.warning("claim failed; retrying", exc_info=True)
                        continue
                    log.warning("claim failed; members released", exc_info=True)
                    self._give_back(chunk.values())
        return ours

    def _give_back(self, jobs: Iterable[Job]) -> None:
        """Members whose claim failed: nothing was sent, so they are due again at once."""
        back = {job.member: job.member.due for job in jobs}
        self.report.handed_back += len(back)
        self._release(back)

    def _release(self, members: Mapping[Member, int]) -> None:
        """Give leased members back to due, each leasable from its score."""
        self.deps.index.release(self.bucket, self.owner, members)
        for m in members:
            self.held_leases.pop(m, None)

    def _claim_chunk(self, key: str, named: dict[str, Job]) -> list[Job]:
        entries = {name: job.entry for name, job in named.items() if job.entry is not None}
        if self.deps.claims.claim(key, entries):
            return list(named.values())
        # Someone holds some of these positions: read them once and sort each out.
        found = self.deps.claims.read([(key, name) for name in named], consistent=True)
        ours: list[Job] = []
        held: dict[Member, int] = {}
        stale: list[Member] = []
        for name, job in named.items():
            existing = found[(key, name)]
            mine = job.entry
            assert mine is not None
            needs_write = existing is None or not (
                existing.finished or (existing.state == "p" and existing.owner == self.owner)
            )
            if needs_write and not self._may_claim():  # one write per entry: mind the deadline
                held[job.member] = job.member.due
                continue
            if existing is None:
                if self.deps.claims.claim(key, {name: mine}):
                    ours.append(job)
                else:
                    held[job.member] = job.member.due  # raced: look again at once
            elif existing.finished:
                job.entry = existing  # fired before: chain from what was recorded
                self.report.already_fired += 1
                ours.append(job)
            elif existing.state == "p" and existing.owner == self.owner:
                ours.append(job)
            elif may_claim(existing, job.member.rev, self.sync.now()):
                if self.deps.claims.take_over(key, name, mine, existing):
                    ours.append(job)
                else:
                    held[job.member] = job.member.due
            elif existing.state == "t":
                stale.append(job.member)  # a change at a newer revision owns the position
            else:  # back when that claim lapses (not before the next window: no busy loop)
                lapse = (existing.until or 0) + LAPSE_MARGIN_MS
                held[job.member] = max(lapse, self.sync.now() + ARM_MS + 1)
        if held:
            self.report.held += len(held)
            self._release(held)
        if stale:
            self.report.stale += len(stale)
            self._forget(stale)
        return ours

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
        self._record(sent)
        self._finish(sent)
        return bool(sent)

    def _record(self, jobs: Sequence[Job]) -> None:
        by_key: dict[str, dict[str, Entry]] = defaultdict(dict)
        for job in jobs:
            d = job.delivery
            assert d is not None and job.entry is not None
            state: State = "d" if d.enqueued_ms is not None else "f"
            at = d.enqueued_ms if d.enqueued_ms is not None else self.sync.now()
            job.entry = by_key[job.ref[0]][job.ref[1]] = Entry(
                state,
                job.entry.rev,
                n=job.entry.n,
                pv=job.entry.pv,
                enqueued=at,
                reason=d.failure,
                fired=job.entry.fired,
                next=job.entry.next,
                end=job.entry.end,
                hook=job.timer.webhook is not None,
            )
            if d.enqueued_ms is not None:
                self.report.enqueued += 1
                self.report.lags_ms.append(d.fired_ms - d.fire_ms)
            else:
                self.report.failed += 1
                self.report.failures.append(f"{d.id}: {d.failure}")
        for key, outcomes in by_key.items():
            for chunk in chunks(outcomes):
                if not self._record_chunk(key, chunk):
                    for name, entry in chunk.items():  # one was taken over: record the rest
                        self._record_chunk(key, {name: entry})
        self._hook("recorded")

    def _record_chunk(self, key: str, entries: Mapping[str, Entry]) -> bool:
        """Record, retried while the deadline leaves time for another attempt and a finish:
        a fire sent and not recorded is sent again once its claim lapses."""
        while True:
            try:
                return self.deps.claims.record(key, self.owner, entries)
            except (BotoCoreError, ClientError):
                if self._left() <= RECORD_CALL_MS + 2 * REDIS_CALL_MS:
                    self.report.unrecorded += len(entries)  # re-sent once their claims lapse
                    raise
                log.warning("record failed; retrying", exc_info=True)

    def _finish(self, jobs: Sequence[Job]) -> None:
        """Checkpoint the timers that need it, then ack and chain in Redis."""
        if not jobs:
            return
        now = self.sync.now()
        done: list[tuple[Member, Member | None]] = []
        for job in jobs:
            entry = job.entry
            assert entry is not None
            if entry.state == "k":
                self.report.skipped += 1
            following = next_member(job.member, entry, job.timer.plan)
            chained = following is not None and following.due <= now + self.deps.lookahead_ms
            if is_recurring(job.timer.schedule) and needs_checkpoint(entry, chained):
                if following is None:
                    self.deps.timers.complete(
                        job.timer, entry.n, job.member.due, now + self.deps.retention_ms
                    )
                else:
                    self.deps.timers.checkpoint(job.timer, following.due, following.n, following.pv)
            done.append((job.member, following if chained else None))
        self._hook("checkpointed")
        earliest = self.deps.index.finish(self.bucket, self.owner, now, done)
        for member, _ in done:
            self.held_leases.pop(member, None)
        if earliest is not None:  # a chained position may be due already (a timer behind)
            self.deps.index.hint(self.bucket, earliest)
            self.next_due = _earliest(self.next_due, earliest)
        self._hook("finished")

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
        """Give back what this run will not finish: claim entries removed (ours only), members
        released to due at once, so the next run takes them over without waiting."""
        unsent = self.pending
        self.pending = []
        try:
            by_key: dict[str, list[str]] = defaultdict(list)
            for job in unsent:
                by_key[job.ref[0]].append(job.ref[1])
            for key, names in by_key.items():
                for chunk in chunks(dict.fromkeys(names)):
                    self.deps.claims.unclaim(key, self.owner, list(chunk))
            if self.held_leases:
                self.report.handed_back += len(self.held_leases)
                self.deps.index.release(self.bucket, self.owner, dict(self.held_leases))
                self.held_leases = {}
        except Exception:  # the leases and claims lapse at the deadline instead
            log.exception("hand-back failed; leases and claims will lapse")

    def _clock_state(self) -> dict[str, int | None]:
        return {"offset_ms": self.sync.offset, "error_ms": self.sync.error}


def _earliest(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)

"""The run: lease a bucket's cards due within ARM_MS, claim them (:mod:`timers.engine.claim`),
send and record each at its instant (:mod:`timers.engine.send`), settle its card in Redis, and
loop while more falls due - within the invocation's deadline, paced to the sandbox's calls
(the Theorem, "Never early" and "Within the function's timeout" in docs/fire-path.md).

What a crash at each step leaves (``hooks`` lets tests crash there), once its leases end:
leased - nothing sent, a run does it all; claimed - a run takes the lapsed claims over and
sends; sent - it sends AGAIN (the duplicate window); recorded, checkpointed - a run only
chains; finished - nothing is left.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import wait
from dataclasses import dataclass, field, replace
from typing import Literal

from timers.core.clock import ClockSync
from timers.engine.callbacks import Delivery, Sender, SqsPort
from timers.engine.changes import Checkpoints
from timers.engine.claim import ARM_MS, DYNAMO_CALL_MS, Claimer, Job
from timers.engine.entries import LAPSE_MARGIN_MS
from timers.engine.index import RUN_BEAT_MS, BucketIndex, Card
from timers.engine.log import FireLog
from timers.engine.send import RECORD_CALL_MS, SQS_CALL_MS, Move, Recorder, Timed, UsagePort
from timers.store.timers_table import TimerStore

log = logging.getLogger(__name__)

LEASE_LIMIT = 100  # cards per lease: at most two claim writes per item, made in parallel
FIRST_LEASE = 10  # a run's first lease: small, so a crowd's first round is claimed and sent at once
SEND_FIRST_MS = 20  # a send due this soon goes before the next lease
SEND_GUARD_MS = 1  # sent once the reference time's lower bound is this far past due
REDIS_CALL_MS = 1_000  # worst case of one Redis call (the client's socket timeout)
TAIL_MS = REDIS_CALL_MS + 500  # the handler after a run: a Redis write, its log line and metrics
SEND_RESERVE_MS = SQS_CALL_MS + RECORD_CALL_MS + 2 * REDIS_CALL_MS + TAIL_MS
"""A send starts only with this left: the send, its record, the settle, clearing the marker
and the handler's tail. Every other call starts only if it ends before the tail (_affords)."""
STOP_LEASING_MS = 15_000  # a run takes no new work after this: the fan-out re-spreads a backlog
LEASE_GRACE_MS = LAPSE_MARGIN_MS + 1_000  # a lease ends only after the run's claims lapsed
HAND_BACK_RETRY_MS = 500  # a hand-back Redis refused is tried again while the run has time

Hook = Literal["leased", "claimed", "sent", "recorded", "checkpointed", "finished"]
HOOKS: tuple[Hook, ...] = ("leased", "claimed", "sent", "recorded", "checkpointed", "finished")


@dataclass
class Pace:
    """How long a sandbox's calls take (a decaying peak, like the fan-out's cold starts), to
    size its runs' leases to what can be claimed and sent in time ("Within the function's
    timeout" in docs/fire-path.md)."""

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
            _end_run(deps.index, bucket, marker)
        raise
    try:
        report = run.go()
    except Exception:
        log.exception("trigger run failed", extra=run.report.summary())
        run.clear()  # not on a kill (BaseException in tests): a killed run does nothing
        raise
    return report


def _end_run(index: BucketIndex, bucket: int, marker: RunMarker) -> None:
    try:
        index.end_run(bucket, marker.slot, marker.token)
    except Exception:  # it expires with its TTL
        log.warning("run marker not cleared", exc_info=True)


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
        self._hook = deps.hooks or (lambda _: None)
        self._beat_at: int | None = None
        self._finishing = False  # its marker says it leases no more
        sender = Sender(
            Timed(deps.sqs, self.sync.now, self.pace.sent),
            self.sync.now,
            deps.sleep,
            self._may_send,
            delivery_queue_url=deps.delivery_queue_url,
        )
        self.records = Recorder(
            deps, self.owner, self.sync, self.report, sender, self._affords, self._hook
        )

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
        _end_run(self.deps.index, self.bucket, marker)

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
        self.records.count([j for j in finished if j.entry and j.entry.owner == self.owner])
        self._finish(finished)
        return _earliest(leased.next_due, self.next_due)

    def _triage(self, cards: Sequence[Card]) -> list[Job]:
        """Each card's job (:meth:`Job.of`). A card overdue by more than half the retention is
        checked against DynamoDB: the fence that stops a stale card expires with its fire-log
        item. A card whose send instant is beyond ARM_MS (a score an older card of its timer
        left) goes back to it unclaimed ("Within the function's timeout" in docs/fire-path.md)."""
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
            jobs.append(Job.of(card, now))
        if gone:
            self.report.stale += len(gone)
            self._drop(gone)
        return jobs

    def _send_due(self) -> bool:
        lower = self.sync.lower()
        sent = self.records.send([j for j in self.pending if j.send_at + SEND_GUARD_MS <= lower])
        done = {id(j) for j in sent}
        self.pending = [j for j in self.pending if id(j) not in done]
        self._finish(self.records.record(sent))
        return bool(sent)

    def _finish(self, jobs: Sequence[Job]) -> None:
        """Move the finished jobs' checkpoints where needed, then settle each card in Redis;
        a card whose owner or checkpoint finds no time goes back as it is."""
        if not jobs:
            return
        now = self.sync.now()
        moves, ended, unfinished = self.records.checkpoint(jobs, now)
        self._hook("checkpointed")
        self._settle(moves, ended, now)
        if unfinished:
            self._release(unfinished)
        self._hook("finished")

    def _settle(self, moves: Sequence[Move], ended: Collection[str] = (), now: int = 0) -> None:
        earliest = self.deps.index.settle(self.bucket, moves, ended, now)
        for card, _, _ in moves:
            self.held.pop(card.member, None)
        self.next_due = _earliest(self.next_due, earliest)

    def _release(self, scores: Mapping[Card, int]) -> None:
        self.deps.index.release(self.bucket, scores)
        for card in scores:
            self.held.pop(card.member, None)

    def _drop(self, cards: Sequence[Card]) -> None:
        """Stale cards leave Redis (a newer revision's own card, if any, is newer: kept)."""
        self._settle([(c, None, c.timer.rev) for c in cards])

    def _counted(self) -> None:
        """Wait for this run's usage writes while its invocation has time left."""
        wait(self.records.counting, timeout=max(0, self._left() - TAIL_MS) / 1000)

    def _hand_back(self) -> None:
        """Give back what this run will not finish: its claims released, its cards due at
        once (while Redis refuses: tried again as long as the run has time)."""
        unsent, self.pending = self.pending, []
        self.records.release(unsent)
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


def _earliest(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)

"""The trigger: fire one bucket's due occurrences exactly as the invariants require.

One run leases a batch of due members from Redis, re-checks each against DynamoDB (changes win),
claims each fire with one conditional write (one callback per fire), sends the callbacks to SQS
in batches of 10 per target queue, records each outcome, advances the timer and acknowledges.

What a crash at each step leaves behind (``hooks`` lets tests crash there), and who finishes it:

============  ==============================================================================
step          after a crash here, once the Redis lease expires another run ...
============  ==============================================================================
leased        ... leases the members again and does everything: nothing was sent.
claimed       ... takes the expired claim over and sends: nothing was sent before.
sent          ... takes the expired claim over and sends AGAIN: the one duplicate window.
recorded      ... finds the fire enqueued/failed, only advances the timer: no re-send.
advanced      ... finds the cursor moved on (the member is stale), acks it: no re-send.
============  ==============================================================================

Duplicates (the same ``fire_id`` twice; on FIFO queues SQS drops the second within its 5-minute
deduplication interval, since ``MessageDeduplicationId`` is the fire id) arise only when SQS
accepted a callback that the trigger could not record as sent:

- the trigger died after the send and before recording it (the ``sent`` row above);
- a SendMessageBatch call timed out or lost its connection after SQS had accepted it, and the
  retry sent it again (such a fire may even be recorded ``failed`` if every retry then failed).

Changes win from the moment the trigger re-reads the timer (consistently) before claiming: a
change landing in the few milliseconds between that read and the claim can still let the old
occurrence fire once.

Everything with side effects is injected (:class:`TriggerDeps`); the decisions (what to fire,
how the timer advances, how late a fire was) are pure functions at the top of the module.
"""

from __future__ import annotations

import functools
import json
import logging
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from botocore.exceptions import BotoCoreError, ClientError

from timers.core.errors import ConcurrentUpdate
from timers.core.schedule import CatchUp, catch_up
from timers.core.timer import Timer, advance, fire_id
from timers.core.times import format_ms
from timers.redis_index import Leased, parse_member
from timers.store import Claim, FireClaims, TimerStore

log = logging.getLogger(__name__)

# ---------------------------------------------------------------- tuning, and why

LEASE_MS = 35_000
"""Redis lease on a batch. The trigger's Lambda Timeout is 30 s (template.yaml), so a lease
outlives the invocation that holds it: it only ever expires under a dead trigger, never under a
slow live one. 5 s of margin covers clock differences between Lambda hosts."""

CLAIM_MS = 30_000
"""Claim on one fire in DynamoDB: as long as the Timeout, so a claim older than that belongs to
a dead invocation and may be taken over. Not longer than LEASE_MS, so the run that reclaims the
expired lease can take the claim over at once: a crashed claimant's fire is re-sent about
LEASE_MS (+ one fan-out tick) after it was claimed."""

SEND_MARGIN_MS = 5_000
"""No SendMessageBatch starts later than this before the claims lapse: one call (connect 1 s +
read 3 s in the handler's client) then finishes while they still hold."""

BATCH_LIMIT = 250
"""Members per run, sized for latency: at an estimated ~10 ms per DynamoDB write over
DYNAMO_WORKERS and ~20 ms per SendMessageBatch over the lanes, claiming, sending, recording and
advancing 250 fires takes under a second (the benchmark measures the real figure), and even the
worst case (every send retried, 4 s client timeouts) stays far inside LEASE_MS. More due members
in a bucket are taken by further runs, which the fan-out starts in parallel when needed."""

CATCH_UP_BUDGET_MS = 5_000
"""A run starts no new round after this: enough for a timer far behind to gain minutes per run,
short enough to leave most of the 30 s Timeout as margin (later ticks continue the catch-up)."""

MAX_ROUNDS = 100
"""Hard bound on rounds per run, whatever the clock says."""

MISFIRE_GRACE_MS = 45_000
"""A cursor less than this behind now is merely late and fires as scheduled whatever the timer's
misfire policy. It exceeds the slowest recovery of our own (a crashed trigger's work returns
after LEASE_MS plus a tick), so our crashes never count as an outage; anything older is an outage
and the misfire policy (fire_once / fire_all / skip) decides."""

SEND_ATTEMPTS = 4
"""Tries per SendMessageBatch entry on throttling or server errors before recording ``failed``."""

SEND_BACKOFF_S = 0.05
"""First retry delay, doubled per retry: 50 + 100 + 200 ms keeps a bad queue's lane short."""

LANE_BATCHES = 10
"""SendMessageBatch calls per send lane (100 messages): a big queue gets several lanes."""

SEND_WORKERS = 16
"""Concurrent send lanes: one tenant's slow or dead queue holds one lane, not the others."""

DYNAMO_WORKERS = 10
"""Concurrent claim/record/advance writes; botocore's default HTTP pool holds 10 connections."""

SQS_BATCH_BYTES = 250_000
"""Payload bytes per SendMessageBatch (SQS caps the batch at 256 KiB; payloads reach 64 KiB)."""

ADVANCE_ATTEMPTS = 5
"""Optimistic re-read-and-retry rounds when the api changes a timer while it fires."""

Step = Literal["leased", "claimed", "sent", "recorded", "advanced"]
STEPS: tuple[Step, ...] = ("leased", "claimed", "sent", "recorded", "advanced")
"""Where ``TriggerDeps.hooks`` is called, in order (crash-injection seams for tests)."""

# Whole-call SQS errors that retrying cannot fix (the queue is gone or we may not send to it).
PERMANENT_SQS_ERRORS = frozenset(
    {
        "AWS.SimpleQueueService.NonExistentQueue",
        "QueueDoesNotExist",
        "AccessDenied",
        "AccessDeniedException",
        "InvalidAddress",
        "InvalidSecurity",
        "KmsAccessDenied",
        "KMS.AccessDeniedException",
        "KmsDisabled",
        "KMS.DisabledException",
        "KmsNotFound",
        "KMS.NotFoundException",
        "AWS.SimpleQueueService.UnsupportedOperation",
        "UnsupportedOperation",
    }
)

# ---------------------------------------------------------------- pure decisions


def is_current(timer: Timer | None, due_ms: int) -> bool:
    """A member may fire only while its timer is active and still waits for exactly this
    occurrence: cancelled, paused, rescheduled or already advanced timers drop it."""
    return timer is not None and timer.status == "active" and timer.next_fire_ms == due_ms


def decide(timer: Timer, due_ms: int, now_ms: int, grace_ms: int = MISFIRE_GRACE_MS) -> CatchUp:
    """What to fire for the due cursor ``due_ms`` at ``now_ms`` (never an occurrence > now);
    ``fire_ms`` None means the misfire policy skipped it."""
    if due_ms > now_ms:
        raise ValueError(f"occurrence {due_ms} is not due at {now_ms}: never fire early")
    decision = catch_up(timer.plan, due_ms, now_ms, timer.misfire, grace_ms)
    assert decision.fire_ms is None or decision.fire_ms <= now_ms
    return decision


def advanced(timer: Timer, fire_ms: int | None, now_ms: int) -> Timer:
    """The timer after its cursor was handled: fired at ``fire_ms``, or skipped (None).

    A failed fire counts like an enqueued one: the occurrence was used up, its failure is on
    record. The completion rule is the core's (:func:`timers.core.timer.advance`).
    """
    return advance(timer, fire_ms, now_ms)


ON_TIME_MS = 100
"""A fire enqueued within this of its due time counts as on time (one SQS round trip)."""

LAG_BUCKETS: tuple[tuple[int, str], ...] = (
    (ON_TIME_MS, "on_time"),
    (200, "le_200ms"),
    (600, "le_600ms"),
    (1_000, "le_1s"),
    (2_000, "le_2s"),
)
LAG_OVER = "gt_2s"


def lag_bucket(lag_ms: int) -> str:
    """Accuracy bucket of one fire's lag (enqueued - scheduled) for the metrics."""
    for limit, name in LAG_BUCKETS:
        if lag_ms <= limit:
            return name
    return LAG_OVER


def callback_body(timer: Timer, fire_ms: int, fired_ms: int) -> str:
    """The contract's callback JSON; the stored payload text is embedded as-is (verbatim)."""
    head = json.dumps(
        {
            "fire_id": fire_id(timer.id, fire_ms),
            "timer_id": timer.id,
            "tenant": timer.tenant,
            "name": timer.name,
            "scheduled_at": format_ms(fire_ms),
            "fired_at": format_ms(fired_ms),
        },
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return f'{head[:-1]},"payload":{timer.payload_json}}}'


# ---------------------------------------------------------------- ports and report


class TriggerIndex(Protocol):
    """The Redis index operations the trigger uses (timers.redis_index.RedisIndex)."""

    def lease(self, bucket: int, now_ms: int, lease_ms: int, limit: int, owner: str) -> Leased: ...
    def ack(self, bucket: int, owner: str, members: Sequence[str]) -> int: ...
    def release(self, bucket: int, owner: str, members: Sequence[str]) -> int: ...
    def add(self, items: Iterable[tuple[str, str, int]]) -> int: ...


class SqsPort(Protocol):
    """boto3's SQS client, as far as the trigger uses it."""

    def send_message_batch(self, *, QueueUrl: str, Entries: Sequence[Any]) -> Any: ...


@dataclass
class TriggerDeps:
    """Everything with a side effect, injected: built once per cold start by the handler."""

    index: TriggerIndex
    sqs: SqsPort
    timers: TimerStore
    fires: FireClaims
    clock: Callable[[], int]
    lookahead_ms: int  # a next cursor due within this goes straight back into Redis
    sleep: Callable[[float], None] = time.sleep
    hooks: Callable[[Step], None] | None = None  # called with each of STEPS (crash seams)
    new_owner: Callable[[], str] = field(default=lambda: uuid.uuid4().hex)
    batch_limit: int = BATCH_LIMIT


@dataclass
class TriggerReport:
    """What one run did, summed over its rounds."""

    bucket: int
    leased: int = 0
    reclaimed: int = 0  # expired leases of crashed runs put back by this run's lease call
    stale: int = 0  # dropped: timer gone, not active, or waiting for another occurrence
    skipped: int = 0  # occurrences the misfire policy skipped
    already_fired: int = 0  # claim found the fire enqueued/failed: only advanced
    held: int = 0  # another live claimant has the fire: left leased for later
    enqueued: int = 0
    failed: int = 0
    lags_ms: list[int] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)  # "<fire id>: <reason>"

    def lag_buckets(self) -> Counter[str]:
        return Counter(lag_bucket(lag) for lag in self.lags_ms)

    def summary(self) -> dict[str, int]:
        """The counts, for the handler's log line and return value."""
        return {
            name: value
            for name, value in vars(self).items()
            if isinstance(value, int) and not isinstance(value, bool)
        }


# ---------------------------------------------------------------- the run


@dataclass
class FireJob:
    """One occurrence of one timer on its way through the run."""

    member: str
    timer: Timer
    due_ms: int  # the cursor the member stood for
    decision: CatchUp
    claim: Claim | None = None
    fired_ms: int = 0
    enqueued_ms: int | None = None
    failure: str | None = None

    @property
    def fire_ms(self) -> int:
        assert self.decision.fire_ms is not None
        return self.decision.fire_ms

    @property
    def id(self) -> str:
        return fire_id(self.timer.id, self.fire_ms)


@dataclass
class Triage:
    """A batch sorted by what DynamoDB says about each member (see :func:`triage`)."""

    stale: list[str] = field(default_factory=list)  # members to drop (ack) without firing
    reindex: list[tuple[str, str, int]] = field(default_factory=list)  # cursors to put back
    skipped: list[FireJob] = field(default_factory=list)  # to advance without a fire
    to_fire: list[FireJob] = field(default_factory=list)


def triage(
    members: Sequence[str], timers: Mapping[tuple[str, str], Timer], now_ms: int, lookahead_ms: int
) -> Triage:
    """Decide for each due member: stale (changes win), skipped (misfire policy) or to fire.

    A stale member's timer, if still due soon, has its current cursor put back into Redis:
    that heals a run that died after advancing the timer but before indexing what comes next.
    """
    result = Triage()
    for m in members:
        tenant, timer_id, due = parse_member(m)
        timer = timers.get((tenant, timer_id))
        if timer is None or not is_current(timer, due):
            result.stale.append(m)
            if timer is not None and _due_soon(timer, now_ms, lookahead_ms):
                result.reindex.append(_occurrence(timer))
            continue
        fire = FireJob(m, timer, due, decide(timer, due, now_ms))
        (result.to_fire if fire.decision.fire_ms is not None else result.skipped).append(fire)
    return result


def run_trigger(deps: TriggerDeps, bucket: int) -> TriggerReport:
    """Fire the bucket's due members: one round, and more while timers are still behind.

    Each round handles one occurrence per timer. When a round chains a next occurrence that is
    already due (a recurring timer catching up after a crash, or ``fire_all`` after an outage)
    the run leases again at once, so such a timer catches up far faster than real time instead
    of keeping its lag for ever (one occurrence per fan-out tick would only keep pace).
    """
    report = TriggerReport(bucket)
    started = deps.clock()
    for _ in range(MAX_ROUNDS):
        still_behind = _round(deps, bucket, report)
        if not still_behind or deps.clock() - started >= CATCH_UP_BUDGET_MS:
            break
    return report


def _round(deps: TriggerDeps, bucket: int, report: TriggerReport) -> bool:
    """Lease, check, claim, send, record, advance, ack one batch (see the module doc).

    Returns whether it chained occurrences that are already due.
    """
    hook = deps.hooks or (lambda step: None)
    owner = deps.new_owner()
    now = deps.clock()
    leased = deps.index.lease(bucket, now, LEASE_MS, deps.batch_limit, owner)
    report.leased += len(leased.members)
    report.reclaimed += leased.reclaimed
    hook("leased")
    if not leased.members:
        return False

    early = [m for m in leased.members if parse_member(m)[2] > now]
    if early:  # the lease script only takes score <= now; a member saying otherwise is corrupt
        log.error("leased members not yet due; released unfired", extra={"members": early})
        deps.index.release(bucket, owner, early)
    due = [m for m in leased.members if parse_member(m)[2] <= now]
    timers = deps.timers.get_many(parse_member(m)[:2] for m in due)
    batch = triage(due, timers, now, deps.lookahead_ms)
    report.stale += len(batch.stale)
    report.skipped += len(batch.skipped)

    with ThreadPoolExecutor(DYNAMO_WORKERS) as pool:
        claim = functools.partial(_claim, deps, owner=owner, now_ms=now)
        for fire, outcome in zip(batch.to_fire, pool.map(claim, batch.to_fire), strict=True):
            fire.claim = outcome
        hook("claimed")

        ours = [f for f in batch.to_fire if f.claim == "claimed"]
        already_fired = [f for f in batch.to_fire if f.claim == "done"]
        report.already_fired += len(already_fired)
        report.held += sum(f.claim == "held" for f in batch.to_fire)  # left leased: back later
        _send(deps, ours, send_until=now + CLAIM_MS - SEND_MARGIN_MS)
        hook("sent")

        # Fires not sent because our claims were about to lapse stay leased, unacked: after the
        # lease expires, a run takes their lapsed claims over and sends them.
        sent = [f for f in ours if f.enqueued_ms is not None or f.failure is not None]
        list(pool.map(functools.partial(_record, deps, owner=owner), sent))
        _tally(report, sent)
        hook("recorded")

        finished = batch.skipped + already_fired + sent
        after = pool.map(functools.partial(_advance, deps, now_ms=now), finished)
        chained = [_occurrence(t) for t in after if t and _due_soon(t, now, deps.lookahead_ms)]
    if batch.reindex + chained:  # chaining: an `every 1 s` timer's next fire is in Redis in time
        deps.index.add(batch.reindex + chained)
    hook("advanced")

    deps.index.ack(bucket, owner, batch.stale + [f.member for f in finished])
    return any(due_ms <= now for _, _, due_ms in chained)


def _due_soon(timer: Timer, now_ms: int, lookahead_ms: int) -> bool:
    """Whether the timer's cursor belongs in Redis now rather than at the migrator's next run."""
    due = timer.next_fire_ms
    return timer.is_due_indexed and due is not None and due <= now_ms + lookahead_ms


def _occurrence(timer: Timer) -> tuple[str, str, int]:
    assert timer.next_fire_ms is not None
    return timer.tenant, timer.id, timer.next_fire_ms


def _claim(deps: TriggerDeps, fire: FireJob, *, owner: str, now_ms: int) -> Claim:
    return deps.fires.claim(fire.timer.tenant, fire.timer.id, fire.fire_ms, owner, now_ms, CLAIM_MS)


def _tally(report: TriggerReport, sent: Iterable[FireJob]) -> None:
    for fire in sent:
        if fire.enqueued_ms is not None:
            report.enqueued += 1
            report.lags_ms.append(fire.enqueued_ms - fire.fire_ms)
        else:
            report.failed += 1
            report.failures.append(f"{fire.id}: {fire.failure}")


def _record(deps: TriggerDeps, fire: FireJob, *, owner: str) -> None:
    """Store the send's outcome on the fire, conditional on our claim (a run that took the
    claim over records its own outcome)."""
    if fire.enqueued_ms is not None:
        deps.fires.record_enqueued(
            fire.id, owner, fire.enqueued_ms, fire.enqueued_ms - fire.fire_ms
        )
    else:
        deps.fires.record_failed(fire.id, owner, fire.failure or "unknown")


def _advance(deps: TriggerDeps, fire: FireJob, *, now_ms: int) -> Timer | None:
    """Move the timer's cursor past ``fire.due_ms``, conditional on the version read.

    On a conflict (the api changed the timer meanwhile) re-read and re-decide: only a timer still
    waiting for ``due_ms`` is advanced; one that was rescheduled or deleted is left as it is.
    """
    timer: Timer | None = fire.timer
    for _ in range(ADVANCE_ATTEMPTS):
        if timer is None or timer.status == "completed" or timer.next_fire_ms != fire.due_ms:
            return None
        try:
            return deps.timers.put(advanced(timer, fire.decision.fire_ms, now_ms))
        except ConcurrentUpdate:
            timer = deps.timers.get(fire.timer.tenant, fire.timer.id)
    # the cursor stays at due_ms: the migrator re-indexes it and a later run advances it
    log.warning("timer kept changing; not advanced", extra={"member": fire.member})
    return None


# ---------------------------------------------------------------- sending


class _PermanentSendError(Exception):
    """The target queue cannot take messages at all (gone, access denied): no point retrying."""


def _send(deps: TriggerDeps, fires: Sequence[FireJob], send_until: int) -> None:
    """Send every fire's callback; sets ``enqueued_ms`` or ``failure`` on each one sent.

    Fires are grouped per target queue and split into lanes of LANE_BATCHES batches; lanes run
    concurrently, so a slow or dead queue delays only its own lanes. A fire whose claim would
    expire before its send is left untouched (another run takes the claim over).
    """
    by_queue: dict[str, list[FireJob]] = {}
    for fire in fires:
        by_queue.setdefault(fire.timer.target_queue_url, []).append(fire)
    lanes: list[tuple[str, list[list[FireJob]]]] = []
    for queue_url, queued in by_queue.items():
        batches = _batches(queued)
        lanes += [
            (queue_url, batches[i : i + LANE_BATCHES]) for i in range(0, len(batches), LANE_BATCHES)
        ]
    dead: dict[str, str] = {}  # queue url -> permanent failure, shared by that queue's lanes

    def run_lane(queue_url: str, batches: list[list[FireJob]]) -> None:
        for batch in batches:
            if queue_url in dead:
                for fire in batch:
                    fire.failure = dead[queue_url]
                continue
            if deps.clock() >= send_until:
                return  # our claims are lapsing: a send now could race a run taking them over
            try:
                _send_batch(deps, queue_url, batch)
            except _PermanentSendError as exc:
                dead[queue_url] = str(exc)
                for fire in batch:
                    fire.failure = str(exc)

    if not lanes:
        return
    with ThreadPoolExecutor(min(SEND_WORKERS, len(lanes))) as pool:
        for future in [pool.submit(run_lane, url, batches) for url, batches in lanes]:
            future.result()


def _batches(fires: Sequence[FireJob]) -> list[list[FireJob]]:
    """SendMessageBatch groups: at most 10 entries and SQS_BATCH_BYTES of payload each."""
    batches: list[list[FireJob]] = []
    size = 0
    for fire in fires:
        need = len(fire.timer.payload_json.encode()) + 1_024  # body envelope + attribute
        if not batches or len(batches[-1]) == 10 or size + need > SQS_BATCH_BYTES:
            batches.append([])
            size = 0
        batches[-1].append(fire)
        size += need
    return batches


def _entry(fire: FireJob, index: int, fifo: bool) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "Id": f"m{index}",
        "MessageBody": callback_body(fire.timer, fire.fire_ms, fire.fired_ms),
        "MessageAttributes": {"fire_id": {"DataType": "String", "StringValue": fire.id}},
    }
    if fifo:
        entry["MessageDeduplicationId"] = fire.id
        entry["MessageGroupId"] = fire.timer.id
    return entry


def _send_batch(deps: TriggerDeps, queue_url: str, batch: list[FireJob]) -> None:
    """One SendMessageBatch with bounded retries of throttled or failed entries.

    Raises _PermanentSendError when the queue itself is unusable (gone, access denied).
    """
    fifo = queue_url.endswith(".fifo")
    pending = dict(enumerate(batch))
    delay = SEND_BACKOFF_S
    last_error = "not sent"
    for attempt in range(SEND_ATTEMPTS):
        if attempt:
            deps.sleep(delay)
            delay *= 2
        fired_ms = deps.clock()
        for fire in pending.values():
            fire.fired_ms = fired_ms
        try:
            response = deps.sqs.send_message_batch(
                QueueUrl=queue_url, Entries=[_entry(f, i, fifo) for i, f in pending.items()]
            )
        except ClientError as exc:
            error = exc.response.get("Error", {})
            code = str(error.get("Code", "ClientError"))
            last_error = f"{code}: {error.get('Message', '')}".strip()
            if code in PERMANENT_SQS_ERRORS:
                raise _PermanentSendError(last_error) from exc
            continue
        except BotoCoreError as exc:  # connection reset, timeout: retryable
            last_error = f"{type(exc).__name__}: {exc}"
            continue
        enqueued_ms = deps.clock()
        for ok in response.get("Successful", []):
            pending.pop(int(ok["Id"][1:])).enqueued_ms = enqueued_ms
        for bad in response.get("Failed", []):
            reason = f"{bad.get('Code', 'Failed')}: {bad.get('Message', '')}".strip()
            if bad.get("SenderFault"):  # the message itself is unacceptable: retrying won't help
                pending.pop(int(bad["Id"][1:])).failure = reason
            else:
                last_error = reason
        if not pending:
            return
    for fire in pending.values():
        fire.failure = f"gave up after {SEND_ATTEMPTS} attempts: {last_error}"

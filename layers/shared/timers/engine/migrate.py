"""Migrator: every timer due within the look-ahead has its card in Redis, bucket by bucket.

Each minute (and at once for a bucket the fan-out saw lost) a run goes over each bucket's wake
listings on its own - a bucket whose Redis shard or reads fail is retried and then left, never
holding up another - in two scans per shard:

- the *upcoming* slice, listings waking within the look-ahead (and since the last pass's
  start: one written meanwhile may be due already): read every run, so what comes due is
  never starved by a long backlog;
- the *cycle* over everything waking before now (overdue one-shots, recurring timers chained in
  Redis at their checkpoints), a budget a run, going on from a saved position.

A listing is answered from Redis where it can be (a card of its revision, or a newer one, or a
checkpoint past it); only the rest costs a timer read and a walk (:func:`restore`). A bucket
without its sentinel ("ok") is *restoring*: its cycle starts over, and the sentinel is set once
the cycle has gone through every listing since - so a flush, a shard that came back empty or a
failover that may have lost writes ends with the whole bucket read again.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

from timers.core.schedule import is_recurring
from timers.core.timer import Timer
from timers.engine import keys
from timers.engine.changes import CREATE_MS, Checkpoints, card_of
from timers.engine.entries import Cursor, drive, walk
from timers.engine.index import BucketIndex, Card, member_of
from timers.engine.log import FireLog
from timers.engine.wake import Listing, WakeItem, WakeStore, shards_of
from timers.store.timers_table import MissingPayload, TimerStore

log = logging.getLogger(__name__)

MIGRATE_BUDGET = 50_000
"""Listings a run reads over all buckets (a listing costs ~20-50 us of CPU; 55 s timeout)."""
PAGE = 500
ATTEMPTS = 3  # tries of a bucket's pass on an error (TRYAGAIN, a failover, a throttle)
RETRY_S = 0.5

Verdict = Literal["alive", "dead", "missing"]


@dataclass(frozen=True)
class MigratorDeps:
    index: BucketIndex
    timers: TimerStore
    log: FireLog
    wake: WakeStore
    checkpoints: Checkpoints
    lookahead_ms: int
    retention_ms: int
    budget: int = MIGRATE_BUDGET
    workers: int = 8
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], int] = lambda: time.time_ns() // 1_000_000  # epoch ms


@dataclass
class MigrationReport:
    window_end_ms: int
    read: int = 0  # listings read
    missing: int = 0  # of those, not answered by Redis: read from DynamoDB
    added: int = 0  # cards put back
    healed: int = 0  # checkpoints moved, timers completed or out of the index, by a walk
    deleted: int = 0  # wake items whose every listing was dead
    budget_hit_buckets: int = 0
    restored_buckets: int = 0  # whole buckets read again since a loss
    failed_buckets: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)

    def add(self, other: MigrationReport) -> None:
        for name, value in other.summary().items():
            if name != "window_end_ms":
                setattr(self, name, getattr(self, name) + value)
        for name, count in other.outcomes.items():
            self.outcomes[name] = self.outcomes.get(name, 0) + count

    def summary(self) -> dict[str, int]:
        return {k: v for k, v in vars(self).items() if isinstance(v, int)}


def run_migrator(
    deps: MigratorDeps, now_ms: int, buckets: Collection[int] | None = None
) -> MigrationReport:
    """One run over every bucket (or those given: a restore the fan-out asked for)."""
    todo = sorted(buckets) if buckets is not None else list(range(deps.index.bucket_count))
    report = MigrationReport(now_ms + deps.lookahead_ms)
    quota = max(PAGE, deps.budget // max(1, len(todo)))
    with ThreadPoolExecutor(max_workers=max(1, min(deps.workers, len(todo)))) as pool:
        for part in pool.map(lambda b: _isolated(deps, b, now_ms, quota), todo):
            report.add(part)
    return report


def _isolated(deps: MigratorDeps, bucket: int, now_ms: int, quota: int) -> MigrationReport:
    """A bucket's pass, retried on errors; one that keeps failing is left to the next run."""
    for attempt in range(ATTEMPTS):
        try:
            return bucket_pass(deps, bucket, now_ms, quota)
        except Exception:
            log.warning(
                "migrator: bucket %s failed (attempt %s)", bucket, attempt + 1, exc_info=True
            )
            deps.sleep(RETRY_S * (attempt + 1))
    return MigrationReport(now_ms + deps.lookahead_ms, failed_buckets=1)


def bucket_pass(deps: MigratorDeps, bucket: int, now_ms: int, quota: int) -> MigrationReport:
    until = now_ms + deps.lookahead_ms
    report = MigrationReport(until)
    sentinel = deps.index.field(bucket, keys.SENTINEL)
    if sentinel is None:  # lost, and no fan-out has seen it yet
        sentinel = f"r{now_ms}.{now_ms}"
        deps.index.swap_field(bucket, keys.SENTINEL, None, sentinel)
    epoch = sentinel.partition(".")[0]  # "ok", or the loss the bucket is restoring from
    saved = json.loads(deps.index.field(bucket, keys.RESUME) or "{}")
    positions: dict[str, str] = saved.get("pos", {}) if saved.get("epoch") == epoch else {}
    # from where the last pass's slice began: a listing written since that came due meanwhile
    # (a create whose fast path failed) is read now, not behind the cycle's backlog
    back = now_ms - deps.lookahead_ms  # how far back at most (none saved: that far)
    since = max(back, min(now_ms, int(saved.get("since", back))))
    shards = shards_of(bucket, deps.index.bucket_count)
    per_shard = max(1, quota // (2 * len(shards)))
    gone: list[str] = []  # ended-chain notes of deleted listings
    for shard in shards:  # what comes due: read whole every run, never behind a backlog
        items = _read(deps.wake, shard, since, until, None, None)[0]
        gone += examine(deps, items, now_ms, until, report)
    ended = 0
    for shard in shards:
        start = positions.get(shard)
        key = {"shard": {"S": shard}, "wake": {"S": start}} if start else None
        items, more = _read(deps.wake, shard, 0, now_ms - 1, per_shard, key)
        gone += examine(deps, items, now_ms, until, report)
        if more is None:
            positions.pop(shard, None)
            ended += 1
        else:
            positions[shard] = more["wake"]["S"]
    report.budget_hit_buckets = int(ended < len(shards))
    if epoch != "ok" and ended == len(shards):
        # every listing was read since the loss: the bucket is whole again (unless a new loss
        # came meanwhile: a new epoch, which the swap does not match)
        current = deps.index.field(bucket, keys.SENTINEL)
        if current is not None and current.partition(".")[0] == epoch:
            report.restored_buckets = int(
                deps.index.swap_field(bucket, keys.SENTINEL, current, "ok")
            )
        positions, epoch = {}, "ok"
    resume = {"epoch": epoch, "pos": positions, "since": now_ms}
    deps.index.set_field(bucket, keys.RESUME, json.dumps(resume))
    deps.index.forget_ended(bucket, gone, now_ms - deps.retention_ms)
    return report


def _read(
    wake: WakeStore, shard: str, low: int, high: int, limit: int | None,
    start: dict[str, Any] | None,
) -> tuple[list[WakeItem], dict[str, Any] | None]:  # fmt: skip
    """Items of the range from ``start``, at most ``limit`` (None: all); and where to go on."""
    items: list[WakeItem] = []
    while True:
        page = PAGE if limit is None else min(PAGE, limit - len(items))
        got, start = wake.window(shard, low, high, page, start)
        items += got
        if start is None or (limit is not None and len(items) >= limit):
            return items, start


def examine(
    deps: MigratorDeps, items: Sequence[WakeItem], now_ms: int, until: int, report: MigrationReport
) -> list[str]:
    """Answer each listing - from Redis where it can be, else from DynamoDB (restoring what
    Redis lacks) - and delete the items whose every listing is dead (R4). Returns the deleted
    listings' ended-chain notes (``member|rev``), which nobody will ask for again."""
    listings = [x for item in items for x in item.listings]
    report.read += len(listings)
    if not listings:
        return []
    held = deps.index.revisions(
        [(x.partition, member_of(x.tenant, x.timer_id), x.rev) for x in listings]
    )
    verdicts: dict[tuple[str, int, int], Verdict] = {}
    for x, (rev, ckpt) in zip(listings, held, strict=True):
        verdicts[(x.timer_id, x.rev, x.pos)] = (
            "missing" if rev < x.rev else "dead" if rev > x.rev or ckpt > x.pos else "alive"
        )
    missing = [x for x in listings if verdicts[(x.timer_id, x.rev, x.pos)] == "missing"]
    if missing:
        found = restore(deps, missing, now_ms, until, report)
        for item in items:
            for x in item.listings:
                if verdicts[(x.timer_id, x.rev, x.pos)] == "missing":
                    verdicts[(x.timer_id, x.rev, x.pos)] = _verdict(x, item, found, now_ms)
    dead = [
        item
        for item in items
        if all(verdicts[(x.timer_id, x.rev, x.pos)] == "dead" for x in item.listings)
    ]
    if dead:
        deps.wake.delete(dead)
        report.deleted += len(dead)
    return [f"{member_of(x.tenant, x.timer_id)}|{x.rev}" for item in dead for x in item.listings]


def _verdict(
    x: Listing, item: WakeItem, found: dict[tuple[str, str], tuple[Timer, Cursor]], now_ms: int
) -> Verdict:
    """A listing Redis could not answer, from its timer and cursor (R4: stable facts only)."""
    got = found.get((x.tenant, x.timer_id))
    if got is None:
        return "dead" if now_ms - item.at > CREATE_MS else "alive"  # a create may be in flight
    timer, cursor = got
    if timer.rev != x.rev:
        return "dead" if timer.rev > x.rev else "alive"
    if is_recurring(timer.schedule) and (timer.next_fire_ms or 0) > x.pos:
        return "dead"  # the checkpoint moved past it: its own listing was written first
    live = cursor.pending is not None or (timer.status == "active" and cursor.pos is not None)
    return "alive" if live else "dead"


def restore(
    deps: MigratorDeps,
    listings: Sequence[Listing],
    now_ms: int,
    until: int,
    report: MigrationReport,
) -> dict[tuple[str, str], tuple[Timer, Cursor]]:
    """Read the timers Redis lacks, walk each to its cursor, and put its card back - or heal what
    the walk shows: a recurring timer done, a checkpoint behind a cursor beyond the window, an
    inactive timer that no longer owes a fire. Returns the timers read, with their cursors."""
    wanted = sorted({(x.tenant, x.timer_id) for x in listings})
    report.missing += len(wanted)
    timers, broken = _read_timers(deps.timers, wanted)
    found = list(timers.values())
    cursors = drive([walk(t) for t in found], lambda refs: deps.log.read(refs, True))
    cards: list[Card] = []
    outcomes: dict[str, int] = {"gone": len(wanted) - len(found) - broken, "broken": broken}
    for timer, cursor in zip(found, cursors, strict=True):
        outcome = _restore_one(deps, timer, cursor, now_ms, until, cards, report)
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    report.added += deps.index.put(cards)
    for name, count in outcomes.items():
        report.outcomes[name] = report.outcomes.get(name, 0) + count
    return {(t.tenant, t.id): (t, c) for t, c in zip(found, cursors, strict=True)}


def _read_timers(
    timers: TimerStore, wanted: list[tuple[str, str]]
) -> tuple[dict[tuple[str, str], Timer], int]:
    """The timers, and how many could not be read whole: one whose payload item is gone is
    never sent with a made-up payload, and must not keep the others of its bucket from Redis."""
    try:
        return timers.get_many(wanted), 0
    except MissingPayload:
        found: dict[tuple[str, str], Timer] = {}
        broken = 0
        for key in wanted:
            try:
                found |= timers.get_many([key])
            except MissingPayload:
                log.error("migrator: timer %s has lost its payload item; it cannot fire", key)
                broken += 1
        return found, broken


def _restore_one(
    deps: MigratorDeps,
    timer: Timer,
    cursor: Cursor,
    now_ms: int,
    until: int,
    cards: list[Card],
    report: MigrationReport,
) -> str:
    owes = cursor.pending is not None
    if cursor.pos is not None and (owes or (timer.status == "active" and cursor.pos <= until)):
        cards.append(card_of(timer, cursor))
        return "added"
    if timer.status != "active":
        if timer.owed:  # its owed fire finished
            report.healed += deps.timers.settle_owed(timer)
        return "idle"
    if cursor.pos is None:
        if is_recurring(timer.schedule):  # its last fire's run died before saying so
            report.healed += deps.timers.complete(
                timer, cursor.n, cursor.last, now_ms + deps.retention_ms
            )
        return "done"
    if is_recurring(timer.schedule) and cursor.pos != timer.next_fire_ms:
        report.healed += deps.checkpoints.move(timer, cursor.pos, cursor.n, cursor.last)
    return "later"

"""Migrator: make sure every timer due within the look-ahead has its position in Redis.

DynamoDB is the truth and Redis only an index, so a run asks Redis first and reads DynamoDB only
for what Redis lacks:

- **Recurring timers** sit in the sparse GSI ``due-index`` at their checkpoint. A chained timer's
  checkpoint lags behind now, so every run sees each active chained timer and asks Redis (one
  script per bucket) whether its chain is alive; a timer whose next occurrence is beyond the
  look-ahead sits at that occurrence and is seen only when it comes near.
- **One-shots** are listed in the ``wakeups`` table, read per shard in due order from a
  watermark that moves past the items whose one-shots all fired or changed.

What Redis lacks is *restored*: the timer is read (consistently), its cursor derived by a walk
over the claim entries, and its position put back with the timer's card. A walk that finds the
timer done, or its next occurrence beyond the look-ahead, heals the checkpoint instead. So after
a FLUSHALL, a failover that lost the last writes, or a run that died at any line, the next run
puts back exactly what is missing - overdue work included, however old (no cliff); adding is
idempotent and skips what fired recently or is alive, so runs may overlap, repeat or be late.

A run's work stays bounded: at most MIGRATE_BUDGET rows over all shards, read in parallel; a
due-index sweep cut by its share continues from a saved position next run.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from timers.adapters.claims import ClaimStore
from timers.adapters.redis_index import FIRED, MISSING, Placement
from timers.adapters.timers_table import TimerStore
from timers.adapters.wakeups import Placed, WakeupStore
from timers.core.chain import Member, drive, walk
from timers.core.schedule import is_recurring
from timers.core.timer import Timer, to_card

MIGRATE_BUDGET = 50_000
"""Rows read per run over all shards (half for each kind). Sized for the Lambda: a row costs
~20-50 us of CPU, so 50k stay far inside the 55 s timeout; raise it with the memory."""
SHARD_WORKERS = 8
RESUME_TTL_MS = 10 * 60_000
"""A due-index resume position older than this is stale; dropping it restarts a sweep."""

Outcome = Literal["stale", "done", "added", "later"]
StartKey = dict[str, dict[str, Any]]


class MigratorIndex(Protocol):
    def alive(self, checks: Any) -> list[int]: ...
    def ensure(self, placements: Any) -> int: ...


class KeyValuePort(Protocol):
    def get(self, name: str) -> Any: ...
    def set(self, name: str, value: str, *, px: int | None = None) -> Any: ...
    def delete(self, *names: str) -> Any: ...


class ResumePositions:
    """Per-shard due-index sweep positions, kept in Redis: losing them restarts a sweep."""

    def __init__(self, client: KeyValuePort, prefix: str = "tq") -> None:
        self._client = client
        self._prefix = prefix

    def key(self, shard: str) -> str:
        return f"{self._prefix}:{{migrator}}:resume:{shard}"

    def get(self, shard: str) -> StartKey | None:
        raw = self._client.get(self.key(shard))
        return None if raw is None else dict(json.loads(raw))

    def put(self, shard: str, position: StartKey | None) -> None:
        if position is None:
            self._client.delete(self.key(shard))
        else:
            self._client.set(self.key(shard), json.dumps(position), px=RESUME_TTL_MS)


@dataclass(frozen=True)
class MigratorDeps:
    index: MigratorIndex
    timers: TimerStore
    claims: ClaimStore
    wakeups: WakeupStore
    positions: ResumePositions
    due_shards: int
    lookahead_ms: int
    retention_ms: int
    budget: int = MIGRATE_BUDGET
    workers: int = SHARD_WORKERS


@dataclass
class MigrationReport:
    window_end_ms: int
    read: int = 0  # rows read (due-index entries and one-shot listings)
    missing: int = 0  # of those, not in Redis: read from DynamoDB
    added: int = 0  # put back into Redis
    healed: int = 0  # checkpoints moved or timers completed by a walk
    watermarks: int = 0  # one-shot shards whose watermark moved
    budget_hit_shards: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)

    def add(self, other: MigrationReport) -> None:
        for name in ("read", "missing", "added", "healed", "watermarks", "budget_hit_shards"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for name, count in other.outcomes.items():
            self.outcomes[name] = self.outcomes.get(name, 0) + count

    def summary(self) -> dict[str, int]:
        return {k: v for k, v in vars(self).items() if isinstance(v, int)}


ShardJob = Callable[[MigratorDeps, str, int, int, int], MigrationReport]


def run_migrator(deps: MigratorDeps, now_ms: int) -> MigrationReport:
    """One run over every shard of both kinds."""
    until = now_ms + deps.lookahead_ms
    quota = max(1, deps.budget // (2 * deps.due_shards))
    kinds: list[ShardJob] = [recurring_shard, one_shot_shard]
    jobs = [(kind, str(s)) for s in range(deps.due_shards) for kind in kinds]
    report = MigrationReport(until)
    with ThreadPoolExecutor(max_workers=max(1, min(deps.workers, len(jobs)))) as pool:
        for part in pool.map(lambda job: job[0](deps, job[1], now_ms, until, quota), jobs):
            report.add(part)
    return report


def recurring_shard(
    deps: MigratorDeps, shard: str, now_ms: int, until: int, quota: int
) -> MigrationReport:
    report = MigrationReport(until)
    start = deps.positions.get(shard)
    rows, resume = deps.timers.due_page(shard, until, quota, start)
    report.read = len(rows)
    states = deps.index.alive([(part, tid, rev, None) for _, tid, _, rev, part in rows])
    missing = [(tenant, tid, rev) for (tenant, tid, _, rev, _), s in zip(rows, states, strict=True)
               if s == MISSING]  # fmt: skip
    restore(deps, missing, now_ms, until, report)
    # Saved only after the adds: a run that dies before this point redoes the same slice.
    deps.positions.put(shard, resume)
    report.budget_hit_shards = int(resume is not None)
    return report


def one_shot_shard(
    deps: MigratorDeps, shard: str, now_ms: int, until: int, quota: int
) -> MigrationReport:
    report = MigrationReport(until)
    mark = deps.wakeups.watermark(shard)
    rows, more = deps.wakeups.window(shard, mark, until, quota)
    listings: list[Placed] = [placed for _, group in rows for placed in group]
    report.read = len(listings)
    states = deps.index.alive([(b, m.timer_id, m.rev, m) for b, m in listings])
    state_of = {(b, str(m)): s for (b, m), s in zip(listings, states, strict=True)}
    missing = [m for b, m in listings if state_of[(b, str(m))] == MISSING]
    outcomes = restore(deps, [(m.tenant, m.timer_id, m.rev) for m in missing], now_ms, until,
                       report, expect={m.timer_id: m.due for m in missing})  # fmt: skip

    def dead(placed: Placed) -> bool:
        partition, member = placed
        state = state_of[(partition, str(member))]
        return state == FIRED or (
            state == MISSING and outcomes.get(member.timer_id) in ("stale", "done")
        )

    moved = mark
    for wake, group in rows:
        if not all(dead(p) for p in group):
            moved = wake
            break
        moved = wake + "~"  # just after this item: everything before it is dead
    if moved != mark and moved is not None:
        deps.wakeups.set_watermark(shard, moved)
        report.watermarks = 1
    report.budget_hit_shards = int(more)
    return report


def restore(
    deps: MigratorDeps,
    keys: Sequence[tuple[str, str, int]],
    now_ms: int,
    until: int,
    report: MigrationReport,
    expect: dict[str, int] | None = None,
) -> dict[str, Outcome]:
    """Read the timers Redis lacks, walk each to its cursor, and put back, heal or drop it.

    ``expect`` (one-shot listings): the due time a listing stands for; a timer that moved
    elsewhere since is stale for that listing."""
    outcomes: dict[str, Outcome] = {}
    if not keys:
        return outcomes
    report.missing += len(keys)
    timers = deps.timers.get_many([(tenant, tid) for tenant, tid, _ in keys])
    current: list[Timer] = []
    for tenant, tid, rev in keys:
        timer = timers.get((tenant, tid))
        moved = expect is not None and timer is not None and timer.next_fire_ms != expect.get(tid)
        if timer is None or timer.rev != rev or timer.status != "active" or moved:
            outcomes[tid] = "stale"
        else:
            current.append(timer)
    cursors = drive([walk(t, now_ms) for t in current], deps.claims.read)
    placements: list[Placement] = []
    for timer, cursor in zip(current, cursors, strict=True):
        if cursor.pos is None:
            outcomes[timer.id] = "done"
            if is_recurring(timer.schedule):  # its last fire's trigger died before saying so
                deps.timers.complete(timer, cursor.n, cursor.last, now_ms + deps.retention_ms)
                report.healed += 1
        elif cursor.pos > until:
            outcomes[timer.id] = "later"
            if is_recurring(timer.schedule) and cursor.pos != timer.next_fire_ms:
                deps.timers.checkpoint(timer, cursor.pos, cursor.n, cursor.last)
                report.healed += 1
        else:
            outcomes[timer.id] = "added"
            member = Member(timer.tenant, timer.id, cursor.pos, timer.rev, cursor.n, cursor.last)
            placements.append((timer.partition, member, to_card(timer)))
    report.added += deps.index.ensure(placements)
    for outcome in outcomes.values():
        report.outcomes[outcome] = report.outcomes.get(outcome, 0) + 1
    return outcomes

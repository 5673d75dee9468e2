"""Migrator: make sure every timer due within the look-ahead has its position in Redis.

DynamoDB is the truth and Redis only an index, so a run asks Redis first and reads DynamoDB only
for what Redis lacks:

- **Recurring timers** sit in the sparse GSI ``due-index`` at their checkpoint. A chained timer's
  checkpoint lags behind now, so every run sees each active chained timer and asks Redis (one
  script per bucket) whether its chain is alive; a timer whose next occurrence is beyond the
  look-ahead sits at that occurrence and is seen only when it comes near.
- **One-shots** are listed in the ``wakeups`` table: every item of a shard due within the
  window is read, and an item is deleted once each of its listings is dead (R4 in
  docs/fire-path.md: its timer gone or changed since, its position finished, or the timer
  inactive with nothing owed) - stable facts, so nothing needed is ever deleted.

What Redis lacks is *restored*: the timer is read (consistently), its cursor derived by a walk
over the claim entries, and its position put back with the timer's card - a pending (owed)
position too, which the next run takes over once its claim lapses. A walk that finds the timer
done, or its next occurrence beyond the look-ahead, heals the checkpoint instead. So after a
FLUSHALL, a failover that lost the last writes, or a run that died at any line, the next run
puts back exactly what is missing - overdue work included, however old (no cliff); adding is
idempotent and skips what fired recently or is alive, so runs may overlap, repeat or be late.

A run's work stays bounded: at most MIGRATE_BUDGET rows over all shards, read in parallel; a
due-index sweep cut by its share continues from a saved position next run.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from timers.adapters.claims import ClaimStore
from timers.adapters.redis_index import FIRED, MISSING, SUPERSEDED, Placement
from timers.adapters.timers_table import TimerStore
from timers.adapters.wakeups import Placed, WakeupStore
from timers.core.chain import Cursor, Member, drive, entry_ref, walk
from timers.core.schedule import is_recurring
from timers.core.timer import Timer, to_card

MIGRATE_BUDGET = 50_000
"""Rows read per run over all shards (half for each kind). Sized for the Lambda: a row costs
~20-50 us of CPU, so 50k stay far inside the 55 s timeout; raise it with the memory."""
SHARD_WORKERS = 8
RESUME_TTL_MS = 10 * 60_000
"""A due-index resume position older than this is stale; dropping it restarts a sweep."""

Outcome = Literal["gone", "done", "added", "later", "idle"]
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
    healed: int = 0  # checkpoints moved, timers completed or out of the index, by a walk
    deleted: int = 0  # wakeup items whose every listing was dead
    budget_hit_shards: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)

    def add(self, other: MigrationReport) -> None:
        for name in ("read", "missing", "added", "healed", "deleted", "budget_hit_shards"):
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
    missing = {(tenant, tid) for (tenant, tid, _, _, _), state in zip(rows, states, strict=True)
               if state == MISSING}  # fmt: skip
    restore(deps, missing, now_ms, until, report)
    # Saved only after the adds: a run that dies before this point redoes the same slice.
    deps.positions.put(shard, resume)
    report.budget_hit_shards = int(resume is not None)
    return report


def one_shot_shard(
    deps: MigratorDeps, shard: str, now_ms: int, until: int, quota: int
) -> MigrationReport:
    report = MigrationReport(until)
    rows, more = deps.wakeups.window(shard, until, quota)
    listings: list[Placed] = [placed for _, group in rows for placed in group]
    report.read = len(listings)
    states = deps.index.alive([(b, m.timer_id, m.rev, m) for b, m in listings])
    state_of = {(b, str(m)): s for (b, m), s in zip(listings, states, strict=True)}
    missing = [(b, m) for b, m in listings if state_of[(b, str(m))] == MISSING]
    timers = restore(deps, {(m.tenant, m.timer_id) for _, m in missing}, now_ms, until, report)
    entries = deps.claims.read(
        [entry_ref(b, m.timer_id, m.due) for b, m in missing], consistent=True
    )

    def dead(placed: Placed) -> bool:
        partition, member = placed
        state = state_of[(partition, str(member))]
        if state != MISSING:  # a newer revision wrote its own listing if it needed one
            return state in (FIRED, SUPERSEDED)
        timer = timers.get((member.tenant, member.timer_id))
        entry = entries[entry_ref(partition, member.timer_id, member.due)]
        return (
            timer is None
            or timer.rev != member.rev  # the change since wrote its own listing if needed
            or (entry is not None and entry.finished)
            or (timer.status != "active" and (entry is None or entry.state != "p"))
        )

    gone = [wake for wake, group in rows if all(dead(p) for p in group)]
    if gone:
        deps.wakeups.delete(shard, gone)
        report.deleted = len(gone)
    report.budget_hit_shards = int(more)
    return report


def restore(
    deps: MigratorDeps,
    keys: Collection[tuple[str, str]],
    now_ms: int,
    until: int,
    report: MigrationReport,
) -> dict[tuple[str, str], Timer]:
    """Read the timers Redis lacks, walk each to its cursor, and put back its position - or heal
    what the walk shows: a recurring timer done (its last trigger died before saying so), a
    checkpoint that lags a cursor beyond the window, an inactive timer that no longer owes a
    fire. Returns the timers read (absent: gone)."""
    if not keys:
        return {}
    report.missing += len(keys)
    timers = deps.timers.get_many(sorted(keys))
    found = list(timers.values())
    cursors = drive([walk(t) for t in found], lambda refs: deps.claims.read(refs, True))
    placements: list[Placement] = []
    outcomes: dict[str, int] = {"gone": len(keys) - len(found)}
    for timer, cursor in zip(found, cursors, strict=True):
        outcome = _restore_one(deps, timer, cursor, now_ms, until, placements, report)
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    report.added += deps.index.ensure(placements)
    for name, count in outcomes.items():
        report.outcomes[name] = report.outcomes.get(name, 0) + count
    return timers


def _restore_one(
    deps: MigratorDeps,
    timer: Timer,
    cursor: Cursor,
    now_ms: int,
    until: int,
    placements: list[Placement],
    report: MigrationReport,
) -> Outcome:
    recurring = is_recurring(timer.schedule)
    owes = cursor.pending is not None
    if cursor.pos is not None and (owes or (timer.status == "active" and cursor.pos <= until)):
        member = Member(timer.tenant, timer.id, cursor.pos, timer.rev, cursor.n, cursor.last)
        placements.append((timer.partition, member, to_card(timer)))
        return "added"
    if timer.status != "active":
        if timer.owed:  # its owed fire finished: out of the index (R4)
            report.healed += deps.timers.settle_owed(timer)
        return "idle"
    if cursor.pos is None:
        if recurring:  # its last fire's trigger died before saying so
            report.healed += deps.timers.complete(
                timer, cursor.n, cursor.last, now_ms + deps.retention_ms
            )
        return "done"
    if recurring and cursor.pos != timer.next_fire_ms:  # the chain left Redis without saying so
        report.healed += deps.timers.checkpoint(timer, cursor.pos, cursor.n, cursor.last)
    return "later"

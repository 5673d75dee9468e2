"""Migrator: put the cursor of every timer due within the look-ahead into the Redis index.

DynamoDB is the truth and Redis only an index. Each active timer has a cursor ``next_fire_ms``
and sits in the sparse ``due-index`` under shard ``crc32(id) % DUE_SHARDS``; the trigger fires a
member only while it equals the cursor and then adds the next occurrence itself (chaining). So a
run reads, per shard, the cursors with ``next_fire_ms <= now + lookahead`` and adds them. That
range has no lower bound, so overdue work is never forgotten (no cliff: a cursor three days
late is read first, the range key sorts ascending); adding is idempotent and skips members a
trigger holds in flight (the add script), so runs may overlap, repeat or be late. After a
FLUSHALL or failover a run rebuilds what Redis lost (up to the budget; the rest next runs).

Why a run's work stays bounded as timers grow:
- the index is sparse (only active timers with a cursor) and KEYS_ONLY (~100 bytes an entry);
- the range condition reads only the window, never the far future;
- shards are read in parallel by ``SHARD_WORKERS`` threads;
- at most ``MIGRATE_BUDGET`` cursors are read per run (split evenly over the shards, which the
  crc32 spreads evenly). A shard that reaches its share stores where it stopped (the query's
  last evaluated key) in Redis and the next run continues from there; a shard that reaches the
  end of its window forgets the position, so its next sweep starts again from the oldest (in
  the same run, with the share it has left). A window holding more than the budget is thus
  covered over several runs, oldest first, and a lost resume position (FLUSHALL) only
  restarts the sweep from the oldest.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from timers.store import TimerItem

# Cursors read per run, over all shards. Sized for the Lambda, not for DynamoDB: deserializing
# an item costs ~20-50 us of CPU and a 256 MB Lambda gets a fraction of a vCPU, so 50k items
# stay far inside the 55 s timeout; 50k keys-only entries (~5 MB) are ~700 eventually
# consistent RCUs. Raise it with the function's memory (the benchmark measures the rate).
MIGRATE_BUDGET = 50_000
# Shards read at once: DynamoDB latency, not CPU, dominates a query page.
SHARD_WORKERS = 8
# Query page size; a keys-only page of 1,000 entries is ~100 KB, well under the 1 MB page cap.
PAGE_SIZE = 1_000
# A resume position older than this is stale; dropping it just restarts a sweep from the oldest.
RESUME_TTL_MS = 10 * 60_000

Cursor = tuple[str, str, int]  # (tenant, timer_id, next_fire_ms)
StartKey = dict[str, dict[str, Any]]  # a DynamoDB ExclusiveStartKey of the due index


@dataclass(frozen=True)
class DuePage:
    """Cursors of one shard read in key order, and where to continue (None: window done)."""

    cursors: list[Cursor]
    resume: StartKey | None


class IndexPort(Protocol):
    """The part of ``RedisIndex`` the migrator uses."""

    def add(self, items: Iterable[Cursor]) -> int: ...


class KeyValuePort(Protocol):
    """The Redis commands the resume positions use."""

    def get(self, name: str) -> Any: ...
    def set(self, name: str, value: str, *, px: int | None = None) -> Any: ...
    def delete(self, *names: str) -> Any: ...


class ResumePositions:
    """Per-shard sweep positions, kept in Redis: losing them only restarts a sweep."""

    def __init__(self, client: KeyValuePort, prefix: str = "tq") -> None:
        self._client = client
        self._prefix = prefix

    def key(self, shard: str) -> str:
        return f"{self._prefix}:{{migrator}}:resume:{shard}"

    def get(self, shard: str) -> StartKey | None:
        raw = self._client.get(self.key(shard))
        if raw is None:
            return None
        position: StartKey = json.loads(raw)
        return position

    def put(self, shard: str, position: StartKey | None) -> None:
        if position is None:
            self._client.delete(self.key(shard))
        else:
            self._client.set(self.key(shard), json.dumps(position), px=RESUME_TTL_MS)


def read_due_page(shard: str, until_ms: int, limit: int, start: StartKey | None) -> DuePage:
    """Up to ``limit`` cursors of a shard due by ``until_ms``, oldest first, from ``start`` on."""
    results = TimerItem.due_index.query(
        shard,
        range_key_condition=TimerItem.next_fire_ms <= until_ms,
        limit=limit,
        page_size=min(limit, PAGE_SIZE),
        last_evaluated_key=start,
    )
    cursors = [(item.tenant, item.timer_id, int(item.next_fire_ms)) for item in results]
    # Fewer than the limit means the query ran dry: the window is done, whatever DynamoDB says.
    resume = results.last_evaluated_key if len(cursors) >= limit else None
    return DuePage(cursors, resume)


@dataclass(frozen=True)
class MigratorDeps:
    index: IndexPort
    positions: ResumePositions
    due_shards: int
    lookahead_ms: int
    read_page: Callable[[str, int, int, StartKey | None], DuePage] = read_due_page
    budget: int = MIGRATE_BUDGET
    workers: int = SHARD_WORKERS


@dataclass(frozen=True)
class ShardResult:
    read: int  # cursors read from the due index
    added: int  # of those, new in Redis (the rest were there already or in flight)
    budget_hit: bool  # stopped at its share; the next run continues where it stopped


@dataclass(frozen=True)
class MigrationReport:
    shards: int
    window_end_ms: int
    read: int
    added: int
    budget_hit_shards: int

    @classmethod
    def of(cls, window_end_ms: int, results: Sequence[ShardResult]) -> MigrationReport:
        return cls(
            shards=len(results),
            window_end_ms=window_end_ms,
            read=sum(r.read for r in results),
            added=sum(r.added for r in results),
            budget_hit_shards=sum(r.budget_hit for r in results),
        )


# ---------------------------------------------------------------- pure decisions


def window_end(now_ms: int, lookahead_ms: int) -> int:
    """Cursors due by this instant are migrated now; later ones wait for a later run."""
    return now_ms + lookahead_ms


def shard_quota(budget: int, shards: int) -> int:
    """Each shard's share of the run's budget (at least one cursor, so every shard progresses)."""
    return max(1, budget // shards)


# ---------------------------------------------------------------- the run


def run_migrator(deps: MigratorDeps, now_ms: int) -> MigrationReport:
    """One migrator run over every shard; see the module docstring for why it is bounded."""
    until_ms = window_end(now_ms, deps.lookahead_ms)
    quota = shard_quota(deps.budget, deps.due_shards)
    shards = [str(s) for s in range(deps.due_shards)]
    with ThreadPoolExecutor(max_workers=max(1, min(deps.workers, len(shards)))) as pool:
        results = list(pool.map(lambda s: migrate_shard(deps, s, until_ms, quota), shards))
    return MigrationReport.of(until_ms, results)


def migrate_shard(deps: MigratorDeps, shard: str, until_ms: int, quota: int) -> ShardResult:
    start = deps.positions.get(shard)
    page = deps.read_page(shard, until_ms, quota, start)
    added = deps.index.add(page.cursors)  # one pipelined round trip (chunked scripts)
    read = len(page.cursors)
    if start is not None and page.resume is None and read < quota:
        # The resumed sweep ended with budget to spare: start the next sweep from the oldest
        # now, so a cursor that went missing behind the position waits no extra run.
        page = deps.read_page(shard, until_ms, quota - read, None)
        added += deps.index.add(page.cursors)
        read += len(page.cursors)
    # Saved only after the adds: a run that dies before this point redoes the same slice.
    deps.positions.put(shard, page.resume)
    return ShardResult(read=read, added=added, budget_hit=page.resume is not None)

"""The migrator against moto and a real redis-server, timers created through the real API.

Guards invariant 2 (never lost): what is due within the look-ahead reaches Redis, overdue work
has no cliff, a flushed Redis is rebuilt, and a run's bounded budget still covers everything
over the following runs. Guards invariant 4 on the migrator's side: paused, completed and
deleted timers are not (re-)indexed.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
import redis

from functions.migrator import app as migrator_app
from ops.local.context import LambdaContext
from tests.integration.api_harness import SETTINGS, Api, make_api
from tests.support.clock import T0, FakeClock
from timers.core.times import format_ms
from timers.migrate import (
    DuePage,
    MigrationReport,
    MigratorDeps,
    ResumePositions,
    StartKey,
    run_migrator,
    shard_quota,
    window_end,
)
from timers.redis_index import RedisIndex, bucket_of, member
from timers.store import due_shard

pytestmark = pytest.mark.integration

EVENTS = Path(__file__).resolve().parents[2] / "events"
LOOKAHEAD_MS = SETTINGS.lookahead_seconds * 1000
HOUR_MS = 3_600_000


@pytest.fixture
def api(
    aws: None, clock: FakeClock, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Api]:
    yield make_api(monkeypatch, clock, redis_url)


def deps_for(api: Api, **overrides: Any) -> MigratorDeps:
    conn = api.runtime.redis
    deps = MigratorDeps(
        index=RedisIndex(conn, SETTINGS.bucket_count),
        positions=ResumePositions(conn),
        due_shards=SETTINGS.due_shards,
        lookahead_ms=LOOKAHEAD_MS,
    )
    return replace(deps, **overrides)


def migrate(api: Api, **overrides: Any) -> MigrationReport:
    return run_migrator(deps_for(api, **overrides), api.clock())


def indexed(api: Api) -> dict[str, float]:
    """Every occurrence waiting in a bucket's due zset -> its score."""
    conn = api.runtime.redis
    return {
        m: score
        for key in conn.scan_iter("tq:*:due")
        for m, score in conn.zrange(key, 0, -1, withscores=True)
    }


def create_at(api: Api, due_ms: int, **extra: Any) -> str:
    timer = api.create(schedule={"type": "at", "at": format_ms(due_ms)}, **extra)
    return str(timer["id"])


def cursor_member(api: Api, timer_id: str) -> str:
    """The member of the timer's cursor, as DynamoDB (the truth) has it."""
    timer = api.runtime.service.timers.get("acme", timer_id)
    assert timer is not None and timer.next_fire_ms is not None
    return member("acme", timer_id, timer.next_fire_ms)


# ---------------------------------------------------------------- pure decisions


def test_window_and_quota() -> None:
    assert window_end(T0, LOOKAHEAD_MS) == T0 + LOOKAHEAD_MS
    assert shard_quota(50_000, 32) == 1_562
    assert shard_quota(10, 32) == 1  # every shard still progresses


@dataclass
class FakeShard:
    """In-memory fakes for one shard: the due index in key order, Redis positions and adds."""

    cursors: list[tuple[str, str, int]]
    added: list[tuple[str, str, int]] = field(default_factory=list)
    store: dict[str, str] = field(default_factory=dict)

    def read_page(self, shard: str, until_ms: int, limit: int, start: StartKey | None) -> DuePage:
        first = 0 if start is None else int(start["i"]["N"]) + 1
        window = [c for c in self.cursors if c[2] <= until_ms][first:]
        page = window[:limit]
        more = len(page) == limit  # DynamoDB hands back a key whenever it stops at the limit
        return DuePage(page, {"i": {"N": str(first + limit - 1)}} if more else None)

    def add(self, items: Iterable[tuple[str, str, int]]) -> int:
        self.added += items
        return 0

    def get(self, name: str) -> str | None:
        return self.store.get(name)

    def set(self, name: str, value: str, *, px: int | None = None) -> None:
        self.store[name] = value

    def delete(self, *names: str) -> None:
        for name in names:
            self.store.pop(name, None)

    def deps(self, budget: int) -> MigratorDeps:
        return MigratorDeps(
            self, ResumePositions(self), 1, LOOKAHEAD_MS, self.read_page, budget=budget
        )


def test_a_sweep_resumes_where_it_stopped_and_wraps_to_the_oldest_in_the_same_run() -> None:
    shard = FakeShard([("acme", f"t{i}", T0 + i) for i in range(5)])
    deps = shard.deps(budget=2)
    order = [c[1] for c in shard.cursors]

    reads = []
    for _ in range(4):
        shard.added.clear()
        report = run_migrator(deps, T0)
        reads.append(([c[1] for c in shard.added], report.budget_hit_shards))
    assert (
        reads
        == [
            (order[0:2], 1),
            (order[2:4], 1),
            (order[4:5] + order[0:1], 1),  # the end of the window, then the oldest again
            (order[1:3], 1),
        ]
    )
    assert all(len(added) <= 2 for added, _ in reads)  # the budget holds every run


# ---------------------------------------------------------------- the window


def test_far_future_timers_enter_redis_only_once_inside_the_look_ahead(api: Api) -> None:
    first = create_at(api, T0 + HOUR_MS)
    every = api.create(schedule={"type": "every", "seconds": 3600})["id"]  # cursor T0 + 1 h
    later = create_at(api, T0 + 2 * HOUR_MS)
    assert indexed(api) == {}  # beyond the API's fast path
    assert migrate(api).read == 0

    api.clock.now = T0 + HOUR_MS - LOOKAHEAD_MS - 1  # one ms short of the window
    assert migrate(api).read == 0
    assert indexed(api) == {}

    api.clock.now = T0 + HOUR_MS - LOOKAHEAD_MS  # the window's end is inclusive
    report = migrate(api)
    assert (report.read, report.added, report.shards) == (2, 2, SETTINGS.due_shards)
    assert indexed(api) == {
        cursor_member(api, first): T0 + HOUR_MS,
        cursor_member(api, every): T0 + HOUR_MS,
    }
    for timer_id in (first, every):  # in the timer's own bucket, scored by its due time
        key = f"tq:{{b{bucket_of(timer_id, SETTINGS.bucket_count)}}}:due"
        assert api.runtime.redis.zscore(key, cursor_member(api, timer_id)) == T0 + HOUR_MS
    assert cursor_member(api, later) not in indexed(api)


def test_overdue_timers_are_picked_up_however_late(api: Api) -> None:
    """No cliff: a run three days late still adds the missed cursors, oldest first."""
    ids = [create_at(api, T0 + HOUR_MS + i * 1000) for i in range(3)]
    api.clock.now = T0 + 3 * 24 * HOUR_MS
    report = migrate(api)
    assert report.added == 3
    assert set(indexed(api)) == {cursor_member(api, i) for i in ids}


def test_paused_completed_and_deleted_timers_are_not_indexed(api: Api) -> None:
    active = create_at(api, T0 + HOUR_MS)
    paused = create_at(api, T0 + HOUR_MS)
    deleted = create_at(api, T0 + HOUR_MS)
    completed = api.create(schedule={"type": "every", "seconds": 3600}, max_fires=1)["id"]
    assert api.call("POST", f"/v1/timers/{paused}/pause").status == 200
    assert api.call("DELETE", f"/v1/timers/{deleted}").status == 204
    store = api.runtime.service.timers
    done = store.get("acme", completed)
    assert done is not None
    store.put(replace(done, fire_count=1))  # as the trigger records a fire
    reply = api.call("PATCH", f"/v1/timers/{completed}", body={"max_fires": 1})
    assert reply.body["status"] == "completed"

    api.clock.now = T0 + 3 * HOUR_MS  # all of them would be overdue
    assert migrate(api).read == 1
    assert set(indexed(api)) == {cursor_member(api, active)}


# ---------------------------------------------------------------- repeat, rebuild, leases


def test_running_twice_is_idempotent(api: Api) -> None:
    ids = [create_at(api, T0 + HOUR_MS + i) for i in range(5)]
    api.clock.now = T0 + HOUR_MS
    assert migrate(api).added == 5
    before = indexed(api)
    again = migrate(api)
    assert (again.read, again.added) == (5, 0)
    assert (
        indexed(api)
        == before
        == {cursor_member(api, i): T0 + HOUR_MS + n for n, i in enumerate(ids)}
    )


def test_a_flushed_redis_is_rebuilt_by_one_run(api: Api) -> None:
    ids = [create_at(api, T0 + HOUR_MS + i * 1000) for i in range(6)]
    api.clock.now = T0 + HOUR_MS
    migrate(api)
    api.runtime.redis.flushall()  # failover to an empty replica
    assert indexed(api) == {}
    assert migrate(api).added == 6
    assert set(indexed(api)) == {cursor_member(api, i) for i in ids}


@pytest.mark.parametrize("crash_at", ["read", "add", "save position"])
def test_a_run_that_dies_midway_is_completed_by_the_next(api: Api, crash_at: str) -> None:
    """Crash injected between the steps of a shard (read -> add -> save position)."""
    ids = [create_at(api, T0 + HOUR_MS + i * 1000) for i in range(40)]
    api.clock.now = T0 + HOUR_MS
    victim = due_shard(ids[0], SETTINGS.due_shards)
    healthy = deps_for(api, budget=SETTINGS.due_shards * 2)  # tiny budget: positions matter

    class Crash(Exception):
        pass

    def read_page(shard: str, until: int, limit: int, start: StartKey | None) -> DuePage:
        if shard == victim and crash_at == "read":
            raise Crash
        return healthy.read_page(shard, until, limit, start)

    class DyingIndex:
        bucket_count = SETTINGS.bucket_count

        def add(self, items: Iterable[tuple[str, str, int]]) -> int:
            items = list(items)
            if crash_at == "add" and any(
                due_shard(i[1], SETTINGS.due_shards) == victim for i in items
            ):
                raise Crash
            return healthy.index.add(items)

    class DyingPositions(ResumePositions):
        def put(self, shard: str, position: StartKey | None) -> None:
            if shard == victim and crash_at == "save position":
                raise Crash
            super().put(shard, position)

    dying = replace(
        healthy,
        read_page=read_page,
        index=DyingIndex(),
        positions=DyingPositions(api.runtime.redis),
    )
    with pytest.raises(Crash):
        run_migrator(dying, api.clock())
    for _ in range(40):  # the following runs, healthy again, reach every cursor
        run_migrator(healthy, api.clock())
    assert set(indexed(api)) == {cursor_member(api, i) for i in ids}


def test_a_member_in_flight_at_a_trigger_is_not_re_added(api: Api) -> None:
    timer_id = create_at(api, T0 + HOUR_MS)
    api.clock.now = T0 + HOUR_MS + 1_000
    assert migrate(api).added == 1
    index = RedisIndex(api.runtime.redis, SETTINGS.bucket_count)
    bucket = bucket_of(timer_id, SETTINGS.bucket_count)
    leased = index.lease(bucket, api.clock(), 30_000, 10, "trigger-1")
    assert leased.members == [cursor_member(api, timer_id)]

    report = migrate(api)
    assert (report.read, report.added) == (1, 0)
    assert index.size(bucket) == (0, 1)  # still only in flight: no second trigger can take it


# ---------------------------------------------------------------- the budget


def test_budget_bounds_a_run_and_the_rest_follows_oldest_first(api: Api) -> None:
    shards = SETTINGS.due_shards
    ids = []
    for i in range(shards + 24):
        ids.append(create_at(api, T0 + HOUR_MS + i * 1000))
        api.clock.advance(100)  # stay under the tenant's request rate limit
    per_shard: dict[str, list[str]] = defaultdict(list)  # oldest first: ids were made in due order
    for timer_id in ids:
        per_shard[due_shard(timer_id, shards)].append(cursor_member(api, timer_id))
    api.clock.now = T0 + 2 * HOUR_MS
    budget = shards  # one cursor per shard and run

    first = migrate(api, budget=budget)
    assert first.read <= budget
    # every shard with more than its share hit the budget (one with exactly its share may
    # too: DynamoDB returns a LastEvaluatedKey whenever it stops at the limit)
    crowded = sum(len(members) > 1 for members in per_shard.values())
    assert crowded <= first.budget_hit_shards <= len(per_shard)
    assert set(indexed(api)) == {members[0] for members in per_shard.values()}  # oldest first

    runs = 1
    while set(indexed(api)) != {cursor_member(api, i) for i in ids}:
        report = migrate(api, budget=budget)
        assert report.read <= budget
        runs += 1
        assert runs <= max(len(m) for m in per_shard.values()) + 1, "no progress"

    # A completed sweep starts again from the oldest: what Redis lost is found again.
    api.runtime.redis.flushall()
    assert set(indexed(api)) == set()
    migrate(api, budget=budget)
    assert set(indexed(api)) == {members[0] for members in per_shard.values()}


# ---------------------------------------------------------------- the handler


def test_handler_runs_on_the_scheduled_event(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    timer_id = create_at(api, T0 + HOUR_MS)
    api.clock.now = T0 + HOUR_MS
    monkeypatch.setattr(migrator_app, "deps", lambda: deps_for(api))
    monkeypatch.setattr(migrator_app, "clock", api.clock)
    event = json.loads((EVENTS / "migrator.json").read_text())

    result = migrator_app.handler(event, LambdaContext(function_name="migrator"))

    assert result["added"] == 1
    assert result["budget_hit_shards"] == 0
    assert cursor_member(api, timer_id) in indexed(api)


@pytest.mark.parametrize("client_class", [redis.RedisCluster, redis.Redis])
def test_a_run_works_on_a_cluster_mode_server(
    api: Api, redis_cluster_url: str, client_class: type[redis.Redis] | type[redis.RedisCluster]
) -> None:
    """ElastiCache Serverless speaks cluster mode: adds and resume positions must route."""
    ids = [create_at(api, T0 + HOUR_MS + i * 1000) for i in range(4)]
    api.clock.now = T0 + HOUR_MS
    client: Any = client_class.from_url(redis_cluster_url, decode_responses=True)
    try:
        client.flushall()
        positions = ResumePositions(client)
        deps = replace(
            deps_for(api), index=RedisIndex(client, SETTINGS.bucket_count), positions=positions
        )
        assert run_migrator(replace(deps, budget=1), api.clock()).read >= 1  # saves positions
        for _ in range(len(ids)):  # positions resume, then reset at the window's end
            run_migrator(replace(deps, budget=1), api.clock())
        assert run_migrator(deps, api.clock()).added == 0
        members = {m for k in client.scan_iter("tq:*:due") for m in client.zrange(k, 0, -1)}
        assert members == {cursor_member(api, i) for i in ids}
    finally:
        client.close()

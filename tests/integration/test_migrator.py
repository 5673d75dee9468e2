"""The migrator against moto and a real redis-server, timers created through the real API.

Guards invariant 2 (never lost): what is due within the look-ahead reaches Redis with its card,
overdue work has no cliff, a flushed Redis - or one that lost its last writes - is rebuilt at
the exact position each timer's claims say, fired work is not put back, and a bounded run's
budget covers everything over the following runs. Guards invariant 4 on the migrator's side:
paused, changed and deleted timers are not put back at their old positions.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from functions.migrator import app as migrator_app
from ops.local.context import LambdaContext
from tests.integration.api_harness import SETTINGS, Api, make_api
from tests.support.chains import fire
from tests.support.clock import T0, FakeClock
from timers.adapters.redis_index import RedisIndex
from timers.core.chain import Member
from timers.core.timer import Timer
from timers.core.times import format_ms
from timers.migrate import MigrationReport, MigratorDeps, ResumePositions, run_migrator
from timers.runtime import DAY_MS, migrator_deps

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
    service = api.runtime.service
    return migrator_deps(SETTINGS, api.runtime.redis, service.timers, service.claims,
                         service.wakeups, **overrides)  # fmt: skip


def migrate(api: Api, **overrides: Any) -> MigrationReport:
    return run_migrator(deps_for(api, **overrides), api.clock())


def indexed(api: Api) -> set[Member]:
    """Every position waiting in Redis, due or leased."""
    conn = api.runtime.redis
    return {
        Member.parse(m)
        for pattern in ("tq:*:due", "tq:*:lease")
        for key in conn.scan_iter(pattern)
        for m in conn.zrange(key, 0, -1)
    }


def cards(api: Api) -> dict[str, int]:
    """Timer id -> revision of the card Redis keeps for it."""
    conn = api.runtime.redis
    return {
        tid: int(card.split("|", 1)[0])
        for key in conn.scan_iter("tq:*:data")
        for tid, card in conn.hgetall(key).items()
    }


def stored(api: Api, timer_id: str) -> Timer:
    timer = api.runtime.service.timers.get("acme", timer_id)
    assert timer is not None
    return timer


def at(due_ms: int) -> dict[str, Any]:
    return {"type": "at", "at": format_ms(due_ms)}


def flushall(api: Api) -> None:
    api.runtime.redis.flushall()


# ---------------------------------------------------------------- getting into Redis


def test_far_future_timers_enter_redis_only_once_inside_the_look_ahead(api: Api) -> None:
    one = api.create(schedule=at(T0 + 3 * HOUR_MS))
    every = api.create(schedule={"type": "every", "seconds": 3 * 3600})
    assert indexed(api) == set()
    api.clock.now = T0 + 3 * HOUR_MS - LOOKAHEAD_MS - 1
    migrate(api)
    assert indexed(api) == set()
    api.clock.advance(1)
    report = migrate(api)
    assert {m.timer_id for m in indexed(api)} == {one["id"], every["id"]}
    assert cards(api) == {one["id"]: 1, every["id"]: 1}  # the trigger needs no read
    assert report.added == 2
    assert migrate(api).added == 0  # running twice adds nothing


def test_overdue_timers_are_picked_up_however_late(api: Api) -> None:
    """No cliff: a one-shot three days overdue (Redis lost it, the migrator did not run)."""
    timer = api.create(schedule=at(T0 + 60_000))
    flushall(api)
    api.clock.advance(3 * DAY_MS)
    migrate(api)
    assert indexed(api) == {Member("acme", timer["id"], T0 + 60_000, 1, 0)}


def test_a_flushed_redis_is_rebuilt_at_the_positions_the_claims_say(api: Api) -> None:
    claims = api.runtime.service.claims
    one_shot = api.create(schedule=at(T0 + 30_000))
    fired_one = api.create(schedule=at(T0 + 20_000))
    every = api.create(schedule={"type": "every", "seconds": 10})
    fire(claims, stored(api, fired_one["id"]), 1)
    fire(claims, stored(api, every["id"]), 5)  # 10:00:10 .. 10:00:50 fired
    api.clock.now = T0 + 55_000
    flushall(api)
    migrate(api)
    assert indexed(api) == {
        Member("acme", one_shot["id"], T0 + 30_000, 1, 0),
        Member("acme", every["id"], T0 + 60_000, 1, 5, T0 + 50_000),
    }  # the fired one-shot is not put back; the recurring one continues after its 5th fire


def test_the_last_writes_redis_lost_are_put_back(api: Api) -> None:
    """A failover to a replica that missed the last writes: some chains are gone, others not."""
    timers = [api.create(schedule={"type": "every", "seconds": 10}) for _ in range(6)]
    conn = api.runtime.redis
    before = indexed(api)
    lost = [m for m in before if m.timer_id in {t["id"] for t in timers[:3]}]
    for m in lost:
        bucket = stored(api, m.timer_id).partition % SETTINGS.bucket_count
        conn.zrem(f"tq:{{b{bucket}}}:due", str(m))
        conn.hdel(f"tq:{{b{bucket}}}:heads", m.timer_id)
    report = migrate(api)
    assert indexed(api) == before
    assert report.missing == 3  # only what Redis lacked was read from DynamoDB


def test_a_member_a_trigger_holds_is_not_added_twice(api: Api) -> None:
    timer = api.create(schedule={"type": "every", "seconds": 10})
    index = RedisIndex(api.runtime.redis, SETTINGS.bucket_count)
    bucket = stored(api, timer["id"]).partition % SETTINGS.bucket_count
    api.clock.now = T0 + 10_000
    leased = index.lease(bucket, now_ms=T0 + 10_000, until_ms=T0 + 10_000,
                         deadline_ms=T0 + 40_000, limit=10, owner="run")  # fmt: skip
    assert len(leased.members) == 1
    migrate(api)
    due, held = index.members(bucket)
    assert (due, held) == ([], leased.members)


def test_changed_paused_and_deleted_timers_are_not_put_back_at_their_old_positions(
    api: Api,
) -> None:
    changed = api.create(schedule=at(T0 + 30_000))
    paused = api.create(schedule={"type": "every", "seconds": 10})
    deleted = api.create(schedule=at(T0 + 30_000))
    api.call("PATCH", f"/v1/timers/{changed['id']}", body={"schedule": at(T0 + 40_000)})
    api.call("POST", f"/v1/timers/{paused['id']}/pause")
    api.call("DELETE", f"/v1/timers/{deleted['id']}")
    flushall(api)
    migrate(api)
    assert indexed(api) == {Member("acme", changed["id"], T0 + 40_000, 2, 0)}


def test_a_recurring_timer_whose_last_fire_was_not_marked_is_completed(api: Api) -> None:
    timer = api.create(schedule={"type": "every", "seconds": 10}, max_fires=2)
    fire(api.runtime.service.claims, stored(api, timer["id"]), 2)  # the run died right after
    api.clock.now = T0 + 25_000
    flushall(api)
    report = migrate(api)
    assert report.healed == 1
    healed = stored(api, timer["id"])
    assert (healed.status, healed.fire_count) == ("completed", 2)
    assert healed.expires_ms == T0 + 25_000 + SETTINGS.fire_retention_days * DAY_MS
    assert indexed(api) == set()


def test_a_stale_checkpoint_beyond_the_window_is_moved_there(api: Api) -> None:
    """A timer whose trigger died before moving its checkpoint out of the window: the walk
    finds its real next position far away, and the checkpoint follows (it stops being read)."""
    timer = api.create(schedule={"type": "every", "seconds": 600})
    fire(api.runtime.service.claims, stored(api, timer["id"]), 1)  # 10:10 fired
    api.clock.now = T0 + 601_000
    flushall(api)
    report = migrate(api)
    assert (report.healed, indexed(api)) == (1, set())
    assert stored(api, timer["id"]).next_fire_ms == T0 + 1_200_000


# ---------------------------------------------------------------- one-shot wakeups


def test_one_create_request_writes_one_wakeup_per_due_minute(api: Api) -> None:
    batch = [{"schedule": at(T0 + 30_000 + i)} for i in range(50)]
    batch += [{"schedule": at(T0 + 90_000)}]
    reply = api.call("POST", "/v1/timers:batch", body={"timers": batch})
    assert reply.status == 201
    items = api.runtime.service.wakeups
    total = sum(
        len(group)
        for shard in range(SETTINGS.due_shards)
        for _, group in items.window(str(shard), T0 + DAY_MS, 100)[0]
    )
    rows = [
        wake
        for shard in range(SETTINGS.due_shards)
        for wake, _ in items.window(str(shard), T0 + DAY_MS, 100)[0]
    ]
    assert (total, len(rows)) == (51, 2)


def wakeups(api: Api) -> list[Member]:
    """Every one-shot listing in the wakeup items."""
    store = api.runtime.service.wakeups
    return [
        member
        for shard in range(SETTINGS.due_shards)
        for _, group in store.window(str(shard), T0 + 365 * DAY_MS, 1_000)[0]
        for _, member in group
    ]


def test_wakeups_of_fired_changed_and_deleted_one_shots_are_deleted_and_no_others(
    api: Api,
) -> None:
    claims = api.runtime.service.claims
    fired = api.create(schedule=at(T0 + 10_000))
    gone = api.create(schedule=at(T0 + 20_000))
    moved = api.create(schedule=at(T0 + 30_000))
    paused = api.create(schedule=at(T0 + 40_000))
    later = api.create(schedule=at(T0 + 90 * 60_000))
    fire(claims, stored(api, fired["id"]), 1)
    api.call("DELETE", f"/v1/timers/{gone['id']}")
    api.call("PATCH", f"/v1/timers/{moved['id']}", body={"schedule": at(T0 + 50_000)})
    api.call("POST", f"/v1/timers/{paused['id']}/pause")
    api.clock.now = T0 + 60 * 60_000
    flushall(api)
    first = migrate(api)
    assert first.deleted >= 4  # fired, deleted, the moved one's first listing, the paused one
    assert {m.timer_id for m in indexed(api)} == {moved["id"]}  # overdue: it fires now
    listed = {(m.timer_id, m.due) for m in wakeups(api)}
    assert listed == {(moved["id"], T0 + 50_000), (later["id"], T0 + 90 * 60_000)}
    fire(claims, stored(api, moved["id"]), 1)
    flushall(api)
    migrate(api)
    assert {m.timer_id for m in wakeups(api)} == {later["id"]}
    api.call("POST", f"/v1/timers/{paused['id']}/resume")
    assert {m.timer_id for m in wakeups(api)} == {later["id"], paused["id"]}


def test_one_shots_due_before_work_already_swept_are_rebuilt_after_a_flush(api: Api) -> None:
    """Issue 16's first scenario: far one-shots are swept into Redis, then nearer ones are
    created or moved nearer, then Redis is flushed. Every one of them must still fire."""
    far = [api.create(schedule=at(T0 + 180_000))["id"] for _ in range(3)]
    api.clock.now = T0 + 61_000
    migrate(api)  # sweeps up to the far ones (T0 + 181 s)
    assert {m.timer_id for m in indexed(api)} >= set(far)
    near = [api.create(schedule={"type": "after", "seconds": 25})["id"] for _ in range(3)]
    moved = far[0]
    api.call("PATCH", f"/v1/timers/{moved}", body={"schedule": {"type": "after", "seconds": 30}})
    flushall(api)
    api.clock.now = T0 + 121_000
    migrate(api)
    assert {m.timer_id for m in indexed(api)} == set(far) | set(near)


def test_an_unfired_overdue_one_shot_is_read_every_run_until_it_fires(api: Api) -> None:
    stuck = api.create(schedule=at(T0 + 10_000))
    after = api.create(schedule=at(T0 + 20_000))
    api.clock.now = T0 + 2 * HOUR_MS
    for _ in range(3):
        flushall(api)
        migrate(api)  # read again every run until it fires
        assert {m.timer_id for m in indexed(api)} == {stuck["id"], after["id"]}


# ---------------------------------------------------------------- bounded runs, failures


def test_budget_bounds_a_run_and_the_rest_follows_over_the_next_runs(api: Api) -> None:
    batch = [{"schedule": {"type": "every", "seconds": 30}} for _ in range(100)]
    created = api.call("POST", "/v1/timers:batch", body={"timers": batch}).body["items"]
    flushall(api)
    budget = 2 * SETTINGS.due_shards  # one recurring row per shard per run
    seen: set[str] = set()
    for _ in range(10):
        report = migrate(api, budget=budget)
        seen |= {m.timer_id for m in indexed(api)}
        if seen == {t["id"] for t in created}:
            break
    assert seen == {t["id"] for t in created}
    assert report.budget_hit_shards >= 0


class FailingOnce(RedisIndex):
    def __init__(self, real: RedisIndex) -> None:
        self.__dict__.update(real.__dict__)
        self.failed = False

    def ensure(self, placements: Any) -> int:
        if not self.failed:
            self.failed = True
            raise redis.ConnectionError("redis went away")
        return super().ensure(placements)


def test_a_run_that_fails_midway_is_completed_by_the_next(api: Api) -> None:
    timer = api.create(schedule=at(T0 + 30_000))
    flushall(api)
    failing = FailingOnce(RedisIndex(api.runtime.redis, SETTINGS.bucket_count))
    with pytest.raises(redis.ConnectionError):
        migrate(api, index=failing, workers=1)
    migrate(api, index=failing)
    assert {m.timer_id for m in indexed(api)} == {timer["id"]}


def test_handler_runs_on_the_scheduled_event(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    timer = api.create(schedule=at(T0 + 30_000))
    flushall(api)
    monkeypatch.setattr(migrator_app, "deps", lambda: deps_for(api))
    monkeypatch.setattr(migrator_app, "clock", api.clock)
    event = json.loads((EVENTS / "migrator.json").read_text())
    summary = migrator_app.handler(event, LambdaContext(function_name="migrator"))
    assert summary["added"] == 1
    assert {m.timer_id for m in indexed(api)} == {timer["id"]}


def test_a_run_works_on_a_cluster_mode_server(api: Api, redis_cluster_url: str) -> None:
    cluster = redis.Redis.from_url(redis_cluster_url, decode_responses=True)
    cluster.flushall()
    timer = api.create(schedule=at(T0 + 30_000))
    migrate(api, index=RedisIndex(cluster, SETTINGS.bucket_count),
            positions=ResumePositions(cluster))  # fmt: skip
    assert any(timer["id"] in m for key in cluster.scan_iter("tq:*:due")
               for m in cluster.zrange(key, 0, -1))  # fmt: skip

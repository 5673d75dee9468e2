"""The migrator (``timers.engine.migrate``) against moto and a real redis-server, timers created
through the real API (or its ``store_new`` where a test needs a timer in a chosen partition).

Guards "never lost" on the migrator's side (docs/fire-path.md): what is due within the
look-ahead reaches Redis with its card, answered from Redis where it can be and restored (timer
read + walk) where not; overdue work is read however old (no cliff); a flushed bucket is read
whole before its sentinel says "ok" again; a listing is deleted only when dead (R4), so a create
racing a run is still found after a flush; each bucket is isolated and retried, and a backlog in
one bucket's cycle never starves what comes due in the upcoming slice.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import boto3
import pytest
import redis
from botocore.exceptions import ClientError

from functions.migrator import app as migrator_app
from ops.local.context import LambdaContext
from tests.integration.api_harness import SETTINGS, Api, make_api
from tests.support.callbacks import drain
from tests.support.clock import T0, FakeClock, injected_clock_fanout
from tests.support.sick_redis import SickRedis
from timers.core.schedule import AtSchedule, EverySchedule, Schedule
from timers.core.timer import Timer, new_timer_id
from timers.core.times import format_ms
from timers.engine import keys
from timers.engine.changes import CREATE_MS
from timers.engine.entries import entry_for, entry_ref, step, successor
from timers.engine.index import NOTED, BucketIndex, member_of
from timers.engine.migrate import ATTEMPTS, MigrationReport, MigratorDeps, run_migrator
from timers.engine.trigger import run_trigger
from timers.engine.wake import WAKE_SHARDS, WakeItem, WakeStore, shards_of
from timers.runtime import DAY_MS, migrator_deps, trigger_deps

pytestmark = pytest.mark.integration

EVENTS = Path(__file__).resolve().parents[2] / "events"
LOOKAHEAD_MS = SETTINGS.lookahead_seconds * 1000
BUCKETS = SETTINGS.bucket_count
HOUR_MS = 3_600_000
MAX_WAKE = 9_999_999_999_999  # the last 13-digit wake time
# Two tenants' partitions in the same wake shard and bucket (partition_for: acme's are
# 2622..2629, globex's 2810..2817)
ACME_SHARD0, GLOBEX_SHARD0 = 2624, 2816
SMALL_PAGE = 16  # migrate.PAGE in the tests that bound a run by a small budget
SMALL_BUDGET = SMALL_PAGE * BUCKETS  # a bucket's quota of SMALL_PAGE items
PER_SHARD = SMALL_PAGE // (2 * len(shards_of(0, BUCKETS)))  # items a shard's scan reads a run


@pytest.fixture
def api(
    aws: None, clock: FakeClock, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Api]:
    yield make_api(monkeypatch, clock, redis_url)


@pytest.fixture
def small_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bucket's quota may go below the usual page floor: SMALL_BUDGET reads PER_SHARD items
    per shard and scan."""
    monkeypatch.setattr("timers.engine.migrate.PAGE", SMALL_PAGE)


def deps_for(api: Api, **overrides: Any) -> MigratorDeps:
    overrides.setdefault("sleep", lambda seconds: None)  # retries never wait for real
    return migrator_deps(api.runtime.wiring, **overrides)


def migrate(api: Api, buckets: list[int] | None = None, **overrides: Any) -> MigrationReport:
    return run_migrator(deps_for(api, **overrides), api.clock(), buckets)


def index_of(api: Api) -> BucketIndex:
    return api.runtime.wiring.index


def indexed(api: Api) -> dict[str, tuple[int, int, int, int | None]]:
    """Timer id -> (position, revision, fires before it, position before) of its card."""
    index = index_of(api)
    return {
        card.timer.id: (card.pos, card.timer.rev, card.n, card.pv)
        for bucket in range(BUCKETS)
        for _, card in index.cards(bucket).values()
    }


def listed(api: Api) -> set[tuple[str, int, int]]:
    """Every wake listing: (timer id, revision, position)."""
    wake = api.runtime.wiring.wake
    out: set[tuple[str, int, int]] = set()
    for shard in range(WAKE_SHARDS):
        start: dict[str, Any] | None = None
        while True:
            items, start = wake.window(str(shard), 0, MAX_WAKE, 500, start)
            out |= {(x.timer_id, x.rev, x.pos) for item in items for x in item.listings}
            if start is None:
                break
    return out


def stored(api: Api, timer_id: str, tenant: str = "acme") -> Timer:
    timer = api.runtime.wiring.timers.get(tenant, timer_id)
    assert timer is not None
    return timer


def bucket_of(timer: Timer) -> int:
    return timer.partition % BUCKETS


def at(due_ms: int) -> dict[str, Any]:
    return {"type": "at", "at": format_ms(due_ms)}


def flushall(api: Api) -> None:
    api.runtime.redis.flushall()


def sentinel(api: Api, bucket: int) -> str | None:
    return index_of(api).field(bucket, keys.SENTINEL)


def whole(api: Api) -> None:
    """Every bucket's sentinel "ok": Redis holds what DynamoDB says (as after a restore)."""
    for bucket in range(BUCKETS):
        index_of(api).set_field(bucket, keys.SENTINEL, "ok")


def forget(api: Api, *timers: Timer) -> None:
    """Redis loses these cards and nothing else (a failover that lost the last writes)."""
    conn = api.runtime.redis
    for timer in timers:
        member = member_of(timer.tenant, timer.id)
        conn.zrem(keys.due(bucket_of(timer)), member)
        conn.hdel(keys.data(bucket_of(timer)), member)


def fire(api: Api, timer: Timer, times: int) -> int | None:
    """Claim and record ``times`` positions of the timer's chain from its checkpoint the way
    the trigger does (each sent at its due time), without moving checkpoints or touching Redis;
    returns the position that comes next."""
    log = api.runtime.wiring.log
    pos, n, pv = timer.next_fire_ms, timer.fire_count, timer.last_fire_pos
    for _ in range(times):
        assert pos is not None, "the timer has no position left to fire"
        decided = step(timer, pos, n, pos)
        pending = entry_for(decided, timer.rev, pos, pv, "test", pos + 30_000)
        done = replace(pending, state="d", owner=None, until=None, enqueued=pos)
        key, name = entry_ref(timer.partition, timer.id, pos)
        assert log.claim(key, {name: done})
        pos, n, pv = successor(done, pos, timer.plan), done.n, pos
    return pos


def seed(api: Api, tenant: str, partition: int, schedule: Schedule, pos: int, anchor: int) -> Timer:
    """A timer in a chosen partition, stored as the api stores a create (its listing, the
    timer, and its card if due within the look-ahead), at its checkpoint ``pos``."""
    now = api.clock()
    timer = Timer(
        tenant=tenant,
        id=new_timer_id(),
        schedule=schedule,
        anchor_ms=anchor,
        target_queue_url=api.queues[tenant],
        payload_json="{}",
        next_fire_ms=pos,
        rev=1,
        partition=partition,
        created_ms=now,
        updated_ms=now,
    )
    api.runtime.wiring.changes.store_new([timer], take_back=False)
    return timer


def fire_bucket(api: Api, bucket: int) -> list[dict[str, Any]]:
    """Run the real trigger on the bucket (its waits move the clock) and read the callbacks."""
    sqs = boto3.client("sqs")
    clock = api.clock
    deps = trigger_deps(api.runtime.wiring, sqs, clock=clock, reference=clock, monotonic=None,
                        sleep=clock.sleep)  # fmt: skip
    run_trigger(deps, bucket, 30_000)
    return [b for url in api.queues.values() for b in drain(sqs, url, clock())]


# ---------------------------------------------------------------- getting into Redis


def test_far_future_timers_enter_redis_only_once_inside_the_look_ahead(api: Api) -> None:
    one = api.create(schedule=at(T0 + 3 * HOUR_MS))
    every = api.create(schedule={"type": "every", "seconds": 3 * 3600})
    assert indexed(api) == {}
    api.clock.now = T0 + 3 * HOUR_MS - LOOKAHEAD_MS - 1
    migrate(api)
    assert indexed(api) == {}
    api.clock.advance(1)
    report = migrate(api)
    assert indexed(api) == {
        one["id"]: (T0 + 3 * HOUR_MS, 1, 0, None),
        every["id"]: (T0 + 3 * HOUR_MS, 1, 0, None),
    }  # each with its card: the trigger needs no read
    assert (report.added, report.missing) == (2, 2)
    again = migrate(api)
    assert (again.added, again.missing, again.read) == (0, 0, 2)  # answered from Redis


def test_overdue_timers_are_picked_up_however_late(api: Api) -> None:
    """No cliff: a one-shot three days overdue (Redis lost it, the migrator did not run)."""
    timer = api.create(schedule=at(T0 + 60_000))
    flushall(api)
    api.clock.advance(3 * DAY_MS)
    migrate(api)
    assert indexed(api) == {timer["id"]: (T0 + 60_000, 1, 0, None)}


def test_a_flushed_redis_is_rebuilt_at_the_positions_the_claims_say(api: Api) -> None:
    one_shot = api.create(schedule=at(T0 + 30_000))
    fired_one = api.create(schedule=at(T0 + 20_000))
    every = api.create(schedule={"type": "every", "seconds": 10})
    fire(api, stored(api, fired_one["id"]), 1)
    fire(api, stored(api, every["id"]), 5)  # 10:00:10 .. 10:00:50 fired
    api.clock.now = T0 + 55_000
    flushall(api)
    report = migrate(api)
    assert indexed(api) == {
        one_shot["id"]: (T0 + 30_000, 1, 0, None),
        every["id"]: (T0 + 60_000, 1, 5, T0 + 50_000),
    }  # the fired one-shot is not put back; the recurring one continues after its 5th fire
    assert report.restored_buckets == BUCKETS  # every bucket read whole, then "ok"
    assert all(sentinel(api, b) == "ok" for b in range(BUCKETS))


def test_the_last_writes_redis_lost_are_put_back(api: Api) -> None:
    """A failover to a replica that missed the last writes: some cards are gone, others not,
    and the sentinel still says "ok"."""
    timers = [api.create(schedule={"type": "every", "seconds": 10}) for _ in range(6)]
    migrate(api)
    before = indexed(api)
    assert set(before) == {t["id"] for t in timers}
    forget(api, *(stored(api, t["id"]) for t in timers[:3]))
    report = migrate(api)
    assert indexed(api) == before
    assert report.missing == 3  # only what Redis lacked was read from DynamoDB


def test_a_card_a_trigger_holds_is_not_put_back(api: Api) -> None:
    timer = stored(api, api.create(schedule={"type": "every", "seconds": 10})["id"])
    index = index_of(api)
    api.clock.now = T0 + 10_000
    leased = index.lease(bucket_of(timer), T0 + 10_000, T0 + 40_000, 10)
    assert [c.timer.id for c in leased.cards] == [timer.id]
    report = migrate(api)
    assert report.missing == 0
    (score, card) = index.cards(bucket_of(timer))[member_of("acme", timer.id)]
    assert (score, card.pos) == (T0 + 40_000, T0 + 10_000)  # still leased, not due again


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
    assert indexed(api) == {changed["id"]: (T0 + 40_000, 2, 0, None)}


def test_a_recurring_timer_whose_last_fire_was_not_marked_is_completed(api: Api) -> None:
    timer = api.create(schedule={"type": "every", "seconds": 10}, max_fires=2)
    fire(api, stored(api, timer["id"]), 2)  # the run died right after
    api.clock.now = T0 + 25_000
    flushall(api)
    report = migrate(api)
    assert report.healed == 1
    healed = stored(api, timer["id"])
    assert (healed.status, healed.fire_count) == ("completed", 2)
    assert healed.expires_ms == T0 + 25_000 + SETTINGS.fire_retention_days * DAY_MS
    assert indexed(api) == {}


def test_a_lagging_checkpoint_beyond_the_window_is_moved_there(api: Api) -> None:
    """A timer whose trigger died before moving its checkpoint out of the window: the walk
    finds its real next position far away, and the checkpoint follows - its new listing first,
    the old one dead from then on and deleted by a later run."""
    timer = api.create(schedule={"type": "every", "seconds": 600})
    fire(api, stored(api, timer["id"]), 1)  # 10:10 fired
    api.clock.now = T0 + 601_000
    flushall(api)
    report = migrate(api)
    assert (report.healed, indexed(api)) == (1, {})
    assert stored(api, timer["id"]).next_fire_ms == T0 + 1_200_000
    assert (timer["id"], 1, T0 + 1_200_000) in listed(api)  # the old one: dead (maybe gone)
    migrate(api)
    assert listed(api) == {(timer["id"], 1, T0 + 1_200_000)}


# ---------------------------------------------------------------- wake listings


def test_one_create_request_writes_one_listing_item_per_shard_and_due_minute(api: Api) -> None:
    batch = [{"schedule": at(T0 + 30_000 + i)} for i in range(50)]
    batch += [{"schedule": at(T0 + 90_000)}]
    reply = api.call("POST", "/v1/timers:batch", body={"timers": batch})
    assert reply.status == 201
    created = [stored(api, t["id"]) for t in reply.body["items"]]
    wake = api.runtime.wiring.wake
    items: list[WakeItem] = [
        item
        for shard in range(WAKE_SHARDS)
        for item in wake.window(str(shard), 0, MAX_WAKE, 1_000)[0]
    ]
    assert sum(len(item.listings) for item in items) == 51
    expected = {
        (t.partition % WAKE_SHARDS, t.next_fire_ms // 60_000) for t in created if t.next_fire_ms
    }
    assert len(items) == len(expected)
    assert {(int(i.shard), int(i.wake[:13]) // 60_000) for i in items} == expected


def test_listings_of_fired_changed_and_deleted_one_shots_are_deleted_and_no_others(
    api: Api,
) -> None:
    fired = api.create(schedule=at(T0 + 10_000))
    gone = api.create(schedule=at(T0 + 20_000))
    moved = api.create(schedule=at(T0 + 30_000))
    paused = api.create(schedule=at(T0 + 40_000))
    later = api.create(schedule=at(T0 + 90 * 60_000))
    fire(api, stored(api, fired["id"]), 1)
    api.call("DELETE", f"/v1/timers/{gone['id']}")
    api.call("PATCH", f"/v1/timers/{moved['id']}", body={"schedule": at(T0 + 50_000)})
    api.call("POST", f"/v1/timers/{paused['id']}/pause")
    api.clock.now = T0 + 60 * 60_000
    flushall(api)
    first = migrate(api)
    assert first.deleted == 4  # fired, deleted, the moved one's first listing, the paused one
    assert set(indexed(api)) == {moved["id"]}  # overdue: it fires now
    assert listed(api) == {(moved["id"], 2, T0 + 50_000), (later["id"], 1, T0 + 90 * 60_000)}
    fire(api, stored(api, moved["id"]), 1)
    flushall(api)
    migrate(api)
    assert listed(api) == {(later["id"], 1, T0 + 90 * 60_000)}
    api.call("POST", f"/v1/timers/{paused['id']}/resume")
    assert {x[0] for x in listed(api)} == {later["id"], paused["id"]}


def test_a_fired_one_shots_listing_is_found_dead_in_redis_without_reading_dynamodb(
    api: Api,
) -> None:
    """The run that fires a timer's last position notes it in Redis; the migrator deletes the
    listing on that note (no timer read, no walk) and forgets the note."""
    timer = stored(api, api.create(schedule=at(T0 + 10_000))["id"])
    api.clock.now = T0 + 10_000
    assert [b["timer_id"] for b in fire_bucket(api, bucket_of(timer))] == [timer.id]
    api.clock.now = T0 + 70_000
    report = migrate(api)
    assert (report.missing, report.deleted) == (0, 1)
    assert listed(api) == set()
    assert api.runtime.redis.zrangebyscore(keys.due(bucket_of(timer)), NOTED, "+inf") == []


def test_a_note_of_an_ended_chain_never_answers_for_a_newer_revision(api: Api) -> None:
    timer = stored(api, api.create(schedule={"type": "every", "seconds": 60}, max_fires=1)["id"])
    api.clock.now = T0 + 60_000
    assert len(fire_bucket(api, bucket_of(timer))) == 1  # its only fire: the chain ended
    reply = api.call("PATCH", f"/v1/timers/{timer.id}", body={"max_fires": 3})
    assert reply.status == 200, reply.body
    changed = stored(api, timer.id)
    assert changed.rev == 2
    forget(api, changed)  # Redis loses the new revision's card; the old note stays
    migrate(api)
    assert indexed(api)[timer.id][1] == 2


def test_a_checkpoint_moved_by_a_chained_run_leaves_its_old_listing_dead_and_deleted(
    api: Api,
) -> None:
    """Every second, fire_once: after a 60 s outage the trigger fires one catch-up and jumps,
    which moves the checkpoint (its new listing first) while the chain stays in Redis. The old
    listing is dead (R4: the checkpoint moved past it); the new one is needed."""
    timer = stored(api, api.create(schedule={"type": "every", "seconds": 1})["id"])
    api.clock.now = T0 + 60_000
    assert len(fire_bucket(api, bucket_of(timer))) == 1  # one catch-up fire for the minute
    moved = stored(api, timer.id).next_fire_ms
    assert moved is not None and moved > T0 + 60_000
    assert (timer.id, 1, T0 + 1_000) in listed(api)
    migrate(api)
    assert (timer.id, 1, moved) in listed(api)  # never a needed one
    assert indexed(api)[timer.id][0] >= moved  # the chain goes on in Redis
    api.clock.advance(60_000)
    migrate(api)
    assert (timer.id, 1, T0 + 1_000) not in listed(api)


def test_one_shots_due_before_work_already_read_are_rebuilt_after_a_flush(api: Api) -> None:
    """Issue 16's first scenario: far one-shots are put in Redis, then nearer ones are created
    or moved nearer, then Redis is flushed. Every one of them must still be found."""
    far = [api.create(schedule=at(T0 + 180_000))["id"] for _ in range(3)]
    api.clock.now = T0 + 61_000
    migrate(api)  # reads up to the far ones (T0 + 181 s)
    assert set(indexed(api)) >= set(far)
    near = [api.create(schedule={"type": "after", "seconds": 25})["id"] for _ in range(3)]
    moved = far[0]
    api.call("PATCH", f"/v1/timers/{moved}", body={"schedule": {"type": "after", "seconds": 30}})
    flushall(api)
    api.clock.now = T0 + 121_000
    migrate(api)
    assert set(indexed(api)) == set(far) | set(near)


def test_an_unfired_overdue_one_shot_is_read_every_run_until_it_fires(api: Api) -> None:
    stuck = stored(api, api.create(schedule=at(T0 + 10_000))["id"])
    after = stored(api, api.create(schedule=at(T0 + 20_000))["id"])
    api.clock.now = T0 + 2 * HOUR_MS
    migrate(api)
    for _ in range(3):
        forget(api, stuck, after)  # lost again, the bucket's sentinel still "ok"
        api.clock.advance(60_000)
        migrate(api)  # the cycle reads them again every run
        assert set(indexed(api)) == {stuck.id, after.id}
    fire(api, stuck, 1)
    fire(api, after, 1)
    forget(api, stuck, after)
    assert migrate(api).deleted == 2
    assert listed(api) == set()


def test_a_create_racing_the_migrator_survives_a_flush(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R4: a create writes its listing, then its timer. A migrator run between the two reads
    the listing of a timer that does not exist yet; it must not take that for dead. Then Redis
    loses everything, and the one-shot must still be found, and fire."""
    store = api.runtime.wiring.timers
    create = store.create
    raced: list[MigrationReport] = []

    def migrator_first(timers: Any) -> None:
        raced.append(migrate(api))
        create(timers)

    monkeypatch.setattr(store, "create", migrator_first)
    timer = stored(api, api.create(schedule={"type": "after", "seconds": 30})["id"])
    monkeypatch.setattr(store, "create", create)
    (report,) = raced
    assert (report.read, report.missing, report.deleted) == (1, 1, 0)  # read, absent, kept

    api.clock.advance(5_000)
    flushall(api)
    migrate(api)
    assert indexed(api) == {timer.id: (T0 + 30_000, 1, 0, None)}
    api.clock.now = T0 + 30_000 - 200
    fired = fire_bucket(api, bucket_of(timer))
    assert [(b["timer_id"], b["scheduled_at"]) for b in fired] == [
        (timer.id, format_ms(T0 + 30_000))
    ]


def test_a_create_slower_than_the_migrator_allows_lists_its_timers_again(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R4 holds for a create that stalls past CREATE_MS between its listing and its timer: the
    migrator may delete the listing meanwhile (no timer, old enough), so the create lists its
    timers again. Without that, a flush would lose the one-shot."""
    store = api.runtime.wiring.timers
    create = store.create
    raced: list[MigrationReport] = []

    def stalled(timers: Any) -> None:
        api.clock.advance(CREATE_MS + 1_000)
        raced.append(migrate(api))
        create(timers)

    monkeypatch.setattr(store, "create", stalled)
    due = T0 + CREATE_MS + LOOKAHEAD_MS // 2  # within the look-ahead of the racing run
    timer = stored(api, api.create(schedule=at(due))["id"])
    monkeypatch.setattr(store, "create", create)
    assert raced[0].deleted == 1  # the stalled create's first listing: taken for dead
    assert (timer.id, 1, due) in listed(api)
    flushall(api)
    migrate(api)
    assert timer.id in indexed(api)


# ---------------------------------------------------------------- bounded runs, restores


def lagging(api: Api, tenant: str, partition: int, count: int) -> list[Timer]:
    """Recurring timers (every minute since T0) whose checkpoints lag: their listings are
    overdue (the cycle reads them), one item each, as chained timers' checkpoint moves write."""
    return [
        seed(api, tenant, partition, EverySchedule(60), T0 + 60_000 * (i + 1), T0)
        for i in range(count)
    ]


def test_a_budget_bounds_a_run_and_the_rest_follows_over_the_next_runs(
    api: Api, small_pages: None
) -> None:
    api.clock.now = T0 + DAY_MS
    timers = [t for p in range(2622, 2630) for t in lagging(api, "acme", p, 3 * PER_SHARD)]
    whole(api)
    forget(api, *timers)  # Redis lost every card (its sentinels still "ok")
    seen: set[str] = set()
    runs: list[MigrationReport] = []
    while len(seen) < len(timers) and len(runs) < 10:
        runs.append(migrate(api, budget=SMALL_BUDGET))
        assert runs[-1].read <= SMALL_BUDGET
        seen |= set(indexed(api))
    assert seen == {t.id for t in timers}
    assert runs[0].budget_hit_buckets == 8  # acme's eight buckets: each read PER_SHARD a run
    assert runs[0].read == 8 * PER_SHARD
    assert len(runs) == 3


def test_a_backlog_in_one_buckets_cycle_never_starves_a_timer_coming_due(
    api: Api, small_pages: None
) -> None:
    """The old defect: a daily timer was read last, behind hundreds of lagging checkpoints, and
    reached Redis 301 s late. Here acme's lagging checkpoints fill shard 0's cycle for several
    runs; globex's daily timer, in the same shard and bucket, comes due in 90 s and is not in
    Redis (its chain left Redis after yesterday's fire). The first run's upcoming slice puts it
    there; the cycle goes on at its own pace."""
    daily = seed(api, "globex", GLOBEX_SHARD0, EverySchedule(86_400), T0 + DAY_MS + 90_000,
                 T0 + 90_000)  # fmt: skip
    api.clock.now = T0 + DAY_MS
    hot = lagging(api, "acme", ACME_SHARD0, 5 * PER_SHARD)
    whole(api)
    assert daily.id not in indexed(api)

    first = migrate(api, budget=SMALL_BUDGET)
    assert indexed(api)[daily.id] == (T0 + DAY_MS + 90_000, 1, 0, None)
    assert first.budget_hit_buckets == 1  # bucket 0's cycle goes on next run
    runs = 1
    while migrate(api, budget=SMALL_BUDGET).budget_hit_buckets:
        runs += 1
    assert runs in (5, 6)  # PER_SHARD items a run (a page ending on the last says "more")
    assert len(hot) == 5 * PER_SHARD


@pytest.mark.parametrize(
    "backlog",
    [
        "overdue",
        pytest.param(
            "upcoming",
        ),
    ],
)
def test_a_restore_ends_ok_only_after_every_listing_was_read(
    api: Api, small_pages: None, backlog: str
) -> None:
    """Redis was flushed: bucket 0 holds more listings in one shard than a run reads. Its
    sentinel says "restoring" until every listing was read, and once it says "ok" again every
    timer it holds is back in Redis."""
    if backlog == "overdue":
        api.clock.now = T0 + DAY_MS
        timers = lagging(api, "acme", ACME_SHARD0, 5 * PER_SHARD)
    else:  # coming due within the look-ahead
        timers = [
            seed(api, "acme", ACME_SHARD0, AtSchedule(T0 + 10_000 * (i + 1)),
                 T0 + 10_000 * (i + 1), T0)
            for i in range(5 * PER_SHARD)
        ]  # fmt: skip
    flushall(api)
    runs = 0
    while sentinel(api, 0) != "ok" and runs < 10:
        migrate(api, budget=SMALL_BUDGET)
        runs += 1
        if sentinel(api, 0) != "ok":
            assert sentinel(api, 0) == f"r{api.clock()}.{api.clock()}"  # restoring since then
    assert sentinel(api, 0) == "ok"
    assert {t.id for t in timers} <= set(indexed(api))
    if backlog == "overdue":
        assert runs >= 5  # the budget held it back: "ok" waited for the last listing


def test_a_restore_longer_than_RESTORE_MS_still_reads_every_listing(
    api: Api, small_pages: None
) -> None:
    """A flushed bucket holds more overdue listings than the runs of one RESTORE_MS read (a
    restore of that one bucket reads its whole quota, SMALL_BUDGET; a run over every bucket, a
    sixteenth of it). The fan-out hands it to the migrator at once and again each RESTORE_MS
    while it restores, and the minute's run goes on too: within a quarter of an hour every
    listing is read, the bucket is "ok" and every timer is back in Redis."""
    api.clock.now = T0 + DAY_MS
    alone = SMALL_BUDGET // (2 * len(shards_of(0, BUCKETS)))  # a lone bucket's restore reads
    timers = lagging(api, "acme", ACME_SHARD0, 3 * alone)  # three of those, and some runs
    flushall(api)
    restores: list[list[int]] = []

    def invoke(FunctionName: str, InvocationType: str, Payload: bytes) -> None:
        event = json.loads(Payload)
        if FunctionName == SETTINGS.migrator_function_name:
            restores.append(event["restore"])

    fanout = injected_clock_fanout(api.runtime.wiring, invoke, api.clock, api.clock.sleep)
    deps = deps_for(api, budget=SMALL_BUDGET)
    for half_minute in range(30):  # every 30 s: a fan-out poll, its restores; each minute, a run
        fanout.act()
        while restores:
            run_migrator(deps, api.clock(), restores.pop(0))
        if half_minute % 2 == 0:
            run_migrator(deps, api.clock())
        api.clock.advance(30_000)
    assert fanout.report.restores >= BUCKETS  # the flush was seen and handed over
    assert sentinel(api, 0) == "ok"
    assert {t.id for t in timers} <= set(indexed(api))


# ---------------------------------------------------------------- failures, one bucket at a time


class FailingWake(WakeStore):
    """The wake listings of some buckets' shards cannot be read (throttled, a network blip)."""

    def __init__(self, real: WakeStore, buckets: set[int]) -> None:
        super().__init__(real.table, 30, real.client)
        self.retention_ms = real.retention_ms
        self.shards = {s for b in buckets for s in shards_of(b, BUCKETS)}
        self.refused = 0

    def window(
        self, shard: str, low: int, high: int, limit: int, start: dict[str, Any] | None = None
    ) -> tuple[list[WakeItem], dict[str, Any] | None]:
        if shard in self.shards:
            self.refused += 1
            error = {"Error": {"Code": "ProvisionedThroughputExceededException", "Message": ""}}
            raise ClientError(error, "Query")  # type: ignore[arg-type]
        return super().window(shard, low, high, limit, start)


@pytest.mark.parametrize("failing", ["redis", "dynamodb"])
def test_one_bucket_failing_delays_no_other(api: Api, failing: str) -> None:
    """One bucket's Redis shard does not answer, or its listings cannot be read: every other
    bucket is migrated in the same run, the failing one is tried ATTEMPTS times and reported,
    and the next run restores it."""
    batch = [{"schedule": at(T0 + 30_000 + i)} for i in range(40)]
    timers = [
        stored(api, t["id"], tenant)
        for tenant in ("acme", "globex")
        for t in api.call("POST", "/v1/timers:batch", tenant=tenant, body={"timers": batch}).body[
            "items"
        ]
    ]
    sick = min(bucket_of(t) for t in timers)  # the first a sequential run would reach
    flushall(api)
    sleeps: list[float] = []
    overrides: dict[str, Any] = {"sleep": sleeps.append, "workers": 1}
    if failing == "redis":
        overrides["index"] = BucketIndex(SickRedis(api.runtime.redis, {sick: "down"}), BUCKETS)
    else:
        overrides["wake"] = FailingWake(api.runtime.wiring.wake, {sick})
    report = migrate(api, **overrides)

    healthy = {t.id for t in timers if bucket_of(t) != sick}
    assert healthy and len(healthy) < len(timers)
    assert set(indexed(api)) == healthy
    assert report.failed_buckets == 1
    assert len(sleeps) == ATTEMPTS  # tried, and tried again
    assert {b for b in range(BUCKETS) if sentinel(api, b) != "ok"} == {sick}

    again = migrate(api)
    assert again.failed_buckets == 0
    assert set(indexed(api)) == {t.id for t in timers}
    assert sentinel(api, sick) == "ok"


class FailingOnce(BucketIndex):
    def __init__(self, real: BucketIndex) -> None:
        self.__dict__.update(real.__dict__)
        self.failed = False

    def put(self, cards: Any) -> int:
        if not self.failed:
            self.failed = True
            raise redis.ConnectionError("redis went away")
        return super().put(cards)


def test_a_bucket_that_fails_midway_is_tried_again_in_the_same_run(api: Api) -> None:
    timer = api.create(schedule=at(T0 + 30_000))
    flushall(api)
    sleeps: list[float] = []
    report = migrate(api, index=FailingOnce(index_of(api)), sleep=sleeps.append)
    assert report.failed_buckets == 0
    assert len(sleeps) == 1
    assert set(indexed(api)) == {timer["id"]}


# ---------------------------------------------------------------- the function


def test_handler_runs_on_the_scheduled_event_and_restores_what_the_fanout_asks(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    timer = stored(api, api.create(schedule=at(T0 + 30_000))["id"])
    monkeypatch.setattr(migrator_app, "deps", lambda: deps_for(api))
    monkeypatch.setattr(migrator_app.runtime, "wall_clock_ms", api.clock)

    flushall(api)
    lost = bucket_of(timer)
    summary = migrator_app.handler({"restore": [lost]}, LambdaContext(function_name="migrator"))
    assert (summary["added"], summary["restored_buckets"]) == (1, 1)
    assert set(indexed(api)) == {timer.id}
    assert [b for b in range(BUCKETS) if sentinel(api, b) is not None] == [lost]  # that one only

    event = json.loads((EVENTS / "migrator.json").read_text())
    summary = migrator_app.handler(event, LambdaContext(function_name="migrator"))
    assert (summary["added"], summary["restored_buckets"]) == (0, BUCKETS - 1)
    assert all(sentinel(api, b) == "ok" for b in range(BUCKETS))


def test_a_run_works_on_a_cluster_mode_server(api: Api, redis_cluster_url: str) -> None:
    cluster = redis.Redis.from_url(redis_cluster_url, decode_responses=True)
    try:
        cluster.flushall()
        timer = api.create(schedule=at(T0 + 30_000))
        index = BucketIndex(cluster, BUCKETS)
        report = migrate(api, index=index)
        assert report.added == 1 and report.restored_buckets == BUCKETS
        held = {c.timer.id: c.pos for b in range(BUCKETS) for _, c in index.cards(b).values()}
        assert held == {timer["id"]: T0 + 30_000}
    finally:
        cluster.close()

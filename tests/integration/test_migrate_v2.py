"""The one-time migration to the engine's storage format (``ops/migrate_v2.py``) on moto.

Old-shape items in - timer items carrying the old due index's ``due_shard``, one-shot wakeup
items in shards "0".."31" with six-field members and no ``at`` - and wake listings out: one for
each live timer (active, or owing a claimed fire) at its checkpoint, none for the others, every
old item deleted, so the new migrator reads every shard again. A second run writes nothing;
``--dry-run`` writes nothing at all.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import replace
from typing import Any

import boto3
import pytest
import redis

from ops import migrate_v2
from ops.template import local_settings
from tests.support.clock import T0, FakeClock
from timers import runtime
from timers.config import Settings
from timers.core.schedule import AtSchedule, CronSchedule, EverySchedule, Schedule
from timers.core.timer import Timer
from timers.engine.index import member_of
from timers.engine.migrate import run_migrator
from timers.engine.wake import WAKE_SHARDS, Listing, WakeStore
from timers.store.timers_table import TimerStore

pytestmark = pytest.mark.integration

OLD_SHARDS = 32  # the previous format's DueShards
DAY_MS = 86_400_000


@pytest.fixture
def settings(aws: None) -> Settings:
    return local_settings()


def _timer(name: str, schedule: Schedule, next_ms: int | None, **fields: Any) -> Timer:
    defaults: dict[str, Any] = {"rev": 1, "partition": 100, "payload_json": json.dumps(name)}
    return Timer(
        tenant="acme",
        id=f"tmr_{name}",
        schedule=schedule,
        anchor_ms=T0 - 60_000,
        target_queue_url="https://sqs.us-east-1.amazonaws.com/123456789012/timers-tenant-acme",
        next_fire_ms=next_ms,
        created_ms=T0 - 60_000,
        updated_ms=T0 - 60_000,
        **{**defaults, **fields},
    )


LIVE = {
    "one_shot": _timer("one_shot", AtSchedule(T0 + 60_000), T0 + 60_000, partition=5),
    "every": _timer("every", EverySchedule(60), T0 - 30_000, partition=70, rev=3, fire_count=9),
    "owed": _timer("owed", EverySchedule(10), T0 - 5_000, partition=71, status="paused", owed=True),
    "big": _timer(
        "big",
        AtSchedule(T0 + 3 * DAY_MS),
        T0 + 3 * DAY_MS,
        partition=2000,
        payload_json=json.dumps({"pad": "x" * 700}),
    ),
}
DEAD = {
    "paused": _timer("paused", CronSchedule("0 7 * * *"), T0 + 3_600_000, status="paused"),
    "completed": _timer(
        "completed", AtSchedule(T0 - DAY_MS), None, status="completed", expires_ms=T0 + 29 * DAY_MS
    ),
    "expired": _timer(
        "expired", AtSchedule(T0 - 40 * DAY_MS), T0 - 40 * DAY_MS, expires_ms=T0 - DAY_MS
    ),  # TTL passed, not yet deleted
}


def _old_wakeup(client: Any, timer: Timer, due: int) -> None:
    """A one-shot wakeup item as the previous format wrote it."""
    suffix = f"{zlib.crc32(timer.id.encode()):012x}"[:12]
    client.put_item(
        TableName="WakeupsTable",
        Item={
            "shard": {"S": str(zlib.crc32(suffix.encode()) % OLD_SHARDS)},
            "wake": {"S": f"{due:013d}#{suffix}"},
            "members": {"L": [{"S": f"{timer.partition}:acme|{timer.id}|{due}|{timer.rev}|0|"}]},
            "expires_at": {"N": str((due + 30 * DAY_MS) // 1000)},
        },
    )


@pytest.fixture
def old_deployment(settings: Settings, clock: FakeClock) -> Any:
    """Timers of every kind stored by the previous format, with their old wakeup items."""
    client = boto3.client("dynamodb")
    store = TimerStore(settings.timers_table, clock=clock)
    for timer in [*LIVE.values(), *DEAD.values()]:
        if payload := store.payload_item(timer):
            payload.save()
        store.item(timer).save()
        client.update_item(  # the old due index's attribute: harmless, never read
            TableName=settings.timers_table,
            Key={"tenant": {"S": timer.tenant}, "timer_id": {"S": timer.id}},
            UpdateExpression="SET due_shard = :s",
            ExpressionAttributeValues={":s": {"S": str(timer.partition % OLD_SHARDS)}},
        )
    for timer in (LIVE["one_shot"], LIVE["big"], DEAD["completed"], DEAD["expired"]):
        _old_wakeup(client, timer, timer.schedule.at_ms)  # type: ignore[union-attr]
    return client


def _items(client: Any) -> list[dict[str, Any]]:
    return client.scan(TableName="WakeupsTable", ConsistentRead=True)["Items"]


def _listings(settings: Settings) -> set[Listing]:
    wake = WakeStore(settings.wakeups_table, settings.fire_retention_days)
    found: set[Listing] = set()
    for shard in range(WAKE_SHARDS):  # the new format reads every shard without a failure
        items, _ = wake.window(str(shard), 0, 9_999_999_999_999, 1_000)
        found |= {x for item in items for x in item.listings}
    return found


def _expected() -> set[Listing]:
    return {
        Listing(t.tenant, t.id, t.rev, t.next_fire_ms, t.partition)  # type: ignore[arg-type]
        for t in LIVE.values()
    }


def test_old_shape_in_new_listings_out(
    old_deployment: Any, settings: Settings, clock: FakeClock
) -> None:
    assert {migrate_v2.item_shape(i) for i in _items(old_deployment)} == {"old"}
    report = migrate_v2.migrate(old_deployment, settings, clock())
    assert report == migrate_v2.Report(
        dry_run=False,
        timers_scanned=len(LIVE) + len(DEAD) - 1,  # the expired one is not counted
        live_timers=len(LIVE),
        listings_present=0,
        listings_written=len(LIVE),
        wake_items_written=len(LIVE),  # each in its own shard and minute
        old_items_deleted=4,
        unrecognized_items=0,
    )
    items = _items(old_deployment)
    assert {migrate_v2.item_shape(i) for i in items} == {"new"}
    assert all(int(i["at"]["N"]) == clock() for i in items)
    assert _listings(settings) == _expected()


def test_the_migrator_reads_every_bucket_again_and_puts_the_timers_due_soon_back(
    old_deployment: Any, settings: Settings, clock: FakeClock, redis_url: str
) -> None:
    """Before the migration the new migrator fails each bucket whose shards hold an old item
    (it cannot parse one); after it, no bucket fails and what is due within the look-ahead is
    back in Redis from its listing."""
    conn = redis.Redis.from_url(redis_url, decode_responses=True)
    conn.flushall()
    wiring = runtime.wire(replace(settings, redis_url=redis_url), clock, conn)
    deps = runtime.migrator_deps(wiring, sleep=lambda _: None)
    before = run_migrator(deps, clock())
    assert before.failed_buckets > 0

    migrate_v2.migrate(old_deployment, settings, clock())
    after = run_migrator(deps, clock())
    assert after.failed_buckets == 0
    # (the owed timer's claim is not in this fire log: the migrator's walk settles it instead)
    for timer in (LIVE["one_shot"], LIVE["every"]):
        cards = wiring.index.cards(wiring.index.bucket_of(timer.partition))
        assert member_of(timer.tenant, timer.id) in cards, timer.id
    big = LIVE["big"]  # three days ahead: found by its listing when it comes near
    assert member_of(big.tenant, big.id) not in wiring.index.cards(
        wiring.index.bucket_of(big.partition)
    )


def test_a_second_run_writes_nothing(
    old_deployment: Any, settings: Settings, clock: FakeClock
) -> None:
    migrate_v2.migrate(old_deployment, settings, clock())
    first = sorted(json.dumps(i, sort_keys=True) for i in _items(old_deployment))
    clock.advance(60_000)
    again = migrate_v2.migrate(old_deployment, settings, clock())
    assert (again.listings_present, again.listings_written, again.wake_items_written) == (
        len(LIVE),
        0,
        0,
    )
    assert again.old_items_deleted == 0
    assert sorted(json.dumps(i, sort_keys=True) for i in _items(old_deployment)) == first


def test_a_listing_written_since_the_deploy_is_kept_and_not_written_twice(
    old_deployment: Any, settings: Settings, clock: FakeClock
) -> None:
    """A change made after the deploy wrote the timer's listing already (in its transaction)."""
    wake = WakeStore(settings.wakeups_table, settings.fire_retention_days)
    every = LIVE["every"]
    wake.put(wake.items([Listing(every.tenant, every.id, every.rev, every.next_fire_ms or 0,
                                 every.partition)], clock()))  # fmt: skip
    report = migrate_v2.migrate(old_deployment, settings, clock())
    assert (report.listings_present, report.listings_written) == (1, len(LIVE) - 1)
    assert _listings(settings) == _expected()


def test_dry_run_writes_nothing(old_deployment: Any, settings: Settings, clock: FakeClock) -> None:
    before = {
        table: sorted(json.dumps(i, sort_keys=True) for i in old_deployment.scan(
            TableName=table, ConsistentRead=True)["Items"])
        for table in (settings.wakeups_table, settings.timers_table)
    }  # fmt: skip
    report = migrate_v2.migrate(old_deployment, settings, clock(), dry_run=True)
    assert report.dry_run
    assert (report.listings_written, report.old_items_deleted) == (len(LIVE), 4)
    after = {
        table: sorted(json.dumps(i, sort_keys=True) for i in old_deployment.scan(
            TableName=table, ConsistentRead=True)["Items"])
        for table in (settings.wakeups_table, settings.timers_table)
    }  # fmt: skip
    assert after == before


def test_items_of_neither_shape_are_counted_and_left_alone(
    settings: Settings, clock: FakeClock
) -> None:
    client = boto3.client("dynamodb")
    odd: dict[str, Any] = {
        "shard": {"S": "7"},
        "wake": {"S": f"{T0:013d}#odd"},
        "at": {"N": str(T0)},
        "members": {"L": [{"S": "7:acme|tmr_x|1|2|3|"}]},
    }
    client.put_item(TableName=settings.wakeups_table, Item=odd)
    report = migrate_v2.migrate(client, settings, clock())
    assert (report.unrecognized_items, report.old_items_deleted) == (1, 0)
    assert _items(client) == [odd]


def test_the_command_prints_its_report_as_the_last_line(
    old_deployment: Any, settings: Settings, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    monkeypatch.setattr(migrate_v2, "_target", lambda: settings)
    assert migrate_v2.main(["--dry-run"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["dry_run"] is True and out["listings_written"] == len(LIVE)
    assert {migrate_v2.item_shape(i) for i in _items(old_deployment)} == {"old"}

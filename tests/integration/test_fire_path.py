"""The whole fire path, end to end on one injected clock: api -> migrator -> fanout -> trigger.

Real redis-server, moto DynamoDB/SQS, the real functions' cores wired as in Lambda: the
migrator runs at each minute, the fanout ticks each second and its async invokes run the
trigger. Redis is flushed mid-run (a failover to an empty replica) and the service still
delivers every fire once, never early, and recurring timers continue.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
import redis

from tests.integration.api_harness import SETTINGS, Api, make_api
from tests.support.callbacks import drain
from tests.support.clock import T0, FakeClock
from timers.core.times import parse_ms
from timers.fanout import Fanout, FanoutDeps
from timers.firing import TriggerDeps, run_trigger
from timers.migrate import MigratorDeps, ResumePositions, run_migrator
from timers.redis_index import Lock
from timers.store import FireClaims

pytestmark = pytest.mark.integration


class World:
    """Drives the deployed shape second by second: what EventBridge and Lambda would do."""

    def __init__(self, api: Api) -> None:
        self.api, self.clock = api, api.clock
        self.redis: redis.Redis = api.runtime.redis
        self.index = api.runtime.service.index
        self.sqs = boto3.client("sqs")
        self.invoked: list[int] = []
        lookahead = SETTINGS.lookahead_seconds * 1000
        self.migrator = MigratorDeps(
            index=self.index,  # type: ignore[arg-type]
            positions=ResumePositions(self.redis),
            due_shards=SETTINGS.due_shards,
            lookahead_ms=lookahead,
        )
        self.fanout = Fanout(
            FanoutDeps(
                index=self.index,  # type: ignore[arg-type]
                lock=Lock(self.redis, "tq:{fanout}:lock", 2_000),
                marker=self.redis,
                invoke=self._invoke,
                trigger_function="trigger",
                clock=self.clock,
                sleep=lambda s: None,
            )
        )
        self.trigger = TriggerDeps(
            index=self.index,  # type: ignore[arg-type]
            sqs=self.sqs,
            timers=api.runtime.service.timers,
            fires=FireClaims(SETTINGS.fire_retention_days),
            clock=self.clock,
            lookahead_ms=lookahead,
            sleep=lambda s: None,
        )
        self.received: list[dict[str, Any]] = []

    def _invoke(self, FunctionName: str, InvocationType: str, Payload: bytes) -> None:
        assert InvocationType == "Event"
        self.invoked.append(json.loads(Payload)["bucket"])

    def second(self) -> None:
        """One second of the deployment: migrator on the minute, a fanout tick, its triggers."""
        now = self.clock.advance(1_000)
        if now % 60_000 == 0:
            run_migrator(self.migrator, now)
        self.fanout.at_boundary(now)
        while self.invoked:
            run_trigger(self.trigger, self.invoked.pop(0))
        for url in self.api.queues.values():
            self.received += drain(self.sqs, url, self.clock())

    def fires_of(self, timer_id: str) -> Counter[int]:
        return Counter(
            parse_ms(b["scheduled_at"]) for b in self.received if b["timer_id"] == timer_id
        )


@pytest.fixture
def world(
    aws: None, clock: FakeClock, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[World]:
    yield World(make_api(monkeypatch, clock, redis_url))


def test_every_fire_once_across_a_redis_flush(world: World) -> None:
    api = world.api
    every = api.create(schedule={"type": "every", "seconds": 1}, misfire="fire_all")
    soon = api.create(schedule={"type": "after", "seconds": 20})
    later = api.create(schedule={"type": "at", "at": "2026-11-21T10:04:00Z"})  # migrator's
    cron = api.create(schedule={"type": "cron", "expression": "*/2 * * * *"}, tenant="globex")

    for _ in range(10):
        world.second()
    world.redis.flushall()  # failover to an empty replica: Redis lost every member and lease
    for _ in range(290):  # to 10:04:59 (T0 = 10:00:00)
        world.second()

    end = world.clock()
    every_fires = world.fires_of(every["id"])
    # fire_all: each second fires once, the ones missed while Redis was empty included
    assert set(every_fires) == set(range(T0 + 1_000, end + 1, 1_000))
    assert max(every_fires.values()) == 1
    assert world.fires_of(soon["id"]) == Counter({T0 + 20_000: 1})
    assert world.fires_of(later["id"]) == Counter({T0 + 240_000: 1})
    assert world.fires_of(cron["id"]) == Counter({T0 + 120_000: 1, T0 + 240_000: 1})
    # each callback went to its own tenant's queue only
    assert {b["tenant"] for b in world.received if b["timer_id"] == cron["id"]} == {"globex"}
    # and the recurring timer continues: its next occurrence is already indexed
    status = api.call("GET", f"/v1/timers/{every['id']}").body
    assert status["status"] == "active"
    assert parse_ms(status["next_fire_at"]) == end + 1_000


def test_a_flush_without_fire_all_catches_up_by_the_misfire_policy(world: World) -> None:
    every = world.api.create(schedule={"type": "every", "seconds": 1})  # fire_once
    for _ in range(10):
        world.second()
    world.redis.flushall()
    for _ in range(110):
        world.second()
    fires = world.fires_of(every["id"])
    assert max(fires.values()) == 1
    # fired every second until the flush and again after the migrator rebuilt Redis at
    # 10:01:00: the 50 s without Redis exceed the 45 s misfire grace, so one catch-up fire
    # stands for the missed ones (fire_once), then it continues on schedule
    before = {t for t in fires if t <= T0 + 10_000}
    after = sorted(t for t in fires if t >= T0 + 60_000)
    assert before == set(range(T0 + 1_000, T0 + 10_001, 1_000))
    assert after == list(range(T0 + 60_000, world.clock() + 1, 1_000))
    assert len(fires) == len(before) + len(after)

"""The whole fire path on one injected clock: api -> migrator -> fan-out -> armed triggers.

Real redis-server, moto DynamoDB/SQS, the real functions' cores wired as in Lambda: the
migrator runs each minute, the fan-out peeks every POLL_MS and its async invokes run the
trigger (whose waits move the clock) or, for a lost bucket, the migrator. Redis is flushed
mid-run (a failover to an empty replica) and the service still delivers every fire once, never
early, on time from the next peek on, and recurring timers continue.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
import redis

from tests.integration.api_harness import Api, make_api
from tests.support.callbacks import drain
from tests.support.clock import T0, FakeClock, injected_clock_fanout
from tests.support.real_parts import RedisTarget
from timers.core.times import parse_ms
from timers.engine.fanout import POLL_MS
from timers.engine.migrate import run_migrator
from timers.engine.trigger import SEND_GUARD_MS, RunMarker, run_trigger
from timers.runtime import migrator_deps, trigger_deps

pytestmark = [pytest.mark.integration, pytest.mark.real_parts]

ON_TIME_MS = SEND_GUARD_MS + 2  # the guard plus the clock's resolution: nothing else


class World:
    """Drives the deployed shape poll by poll: what EventBridge and Lambda would do."""

    def __init__(self, api: Api) -> None:
        self.api, self.clock = api, api.clock
        self.redis: redis.Redis = api.runtime.redis
        wiring = api.runtime.wiring
        self.sqs = boto3.client("sqs")
        self.invoked: list[dict[str, Any]] = []
        self.migrator = migrator_deps(wiring, sleep=self._sleep)
        self.fanout = injected_clock_fanout(wiring, self._invoke, self.clock, self._sleep)
        self.trigger = trigger_deps(wiring, self.sqs, clock=self.clock, reference=self.clock,
                                    monotonic=None, sleep=self._sleep)  # fmt: skip
        self.received: list[dict[str, Any]] = []
        self.triggers = 0
        self.restores: list[list[int]] = []
        self._minute = -1

    def _sleep(self, seconds: float) -> None:
        self.clock.advance(max(1, math.ceil(seconds * 1000)))

    def _invoke(self, FunctionName: str, InvocationType: str, Payload: bytes) -> None:
        assert InvocationType == "Event"
        self.invoked.append({"function": FunctionName, **json.loads(Payload)})

    def run_until(self, end_ms: int) -> None:
        """Polls until ``end_ms``: the migrator on each minute, the triggers and restores the
        fan-out starts (run at once: an invoke takes no time here), the queues read each
        second."""
        second = self.clock() // 1000
        while self.clock() < end_ms:
            if self.clock() // 60_000 != self._minute:
                self._minute = self.clock() // 60_000
                run_migrator(self.migrator, self.clock())
            self.fanout.act()
            while self.invoked:
                event = self.invoked.pop(0)
                if "restore" in event:
                    self.restores.append(event["restore"])
                    run_migrator(self.migrator, self.clock(), event["restore"])
                    continue
                self.start_trigger(event)
            if self.clock() // 1000 != second:
                second = self.clock() // 1000
                self.read_queues()
            self.clock.advance(POLL_MS)
        self.read_queues()

    def start_trigger(self, event: dict[str, Any]) -> None:
        """One trigger run the fan-out started, to its end."""
        marker = RunMarker(event["slot"], event["token"])
        run_trigger(self.trigger, event["bucket"], 30_000, marker)
        self.triggers += 1

    def read_queues(self) -> None:
        for url in self.api.queues.values():
            self.received += drain(self.sqs, url, self.clock())

    def fires_of(self, timer_id: str) -> Counter[int]:
        return Counter(
            parse_ms(b["scheduled_at"]) for b in self.received if b["timer_id"] == timer_id
        )

    def lags(self, timer_id: str) -> dict[int, int]:
        return {
            parse_ms(b["scheduled_at"]): parse_ms(b["fired_at"]) - parse_ms(b["scheduled_at"])
            for b in self.received
            if b["timer_id"] == timer_id
        }


@pytest.fixture
def world(
    aws_tables: str | None, clock: FakeClock, redis_target: RedisTarget,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[World]:  # fmt: skip
    """On a redis-server and moto, or (make test-real) a Redis Cluster and DynamoDB Local."""
    yield World(make_api(monkeypatch, clock, redis_target))


def test_a_flush_is_restored_within_seconds(world: World) -> None:
    api = world.api
    every = api.create(schedule={"type": "every", "seconds": 1}, misfire="fire_all")
    soon = api.create(schedule={"type": "after", "seconds": 20.25})
    later = api.create(schedule={"type": "at", "at": "2026-11-21T10:04:00.500Z"})  # migrator's
    cron = api.create(schedule={"type": "cron", "expression": "*/2 * * * *"}, tenant="globex")

    world.run_until(T0 + 10_400)
    world.restores.clear()
    world.redis.flushall()  # failover to an empty replica: Redis lost every card and lease
    world.run_until(T0 + 299_000)  # to 10:04:59

    end = world.clock()
    every_fires = world.fires_of(every["id"])
    # fire_all: each second fires once, the ones missed while Redis was empty included
    assert set(every_fires) == set(range(T0 + 1_000, end + 1, 1_000))
    assert max(every_fires.values()) == 1
    assert world.fires_of(soon["id"]) == Counter({T0 + 20_250: 1})
    assert world.fires_of(later["id"]) == Counter({T0 + 240_500: 1})
    assert world.fires_of(cron["id"]) == Counter({T0 + 120_000: 1, T0 + 240_000: 1})
    # each callback went to its own tenant's queue only
    assert {b["tenant"] for b in world.received if b["timer_id"] == cron["id"]} == {"globex"}

    # the next peek saw every bucket lost and had each restored at once
    assert sorted(b for buckets in world.restores for b in buckets) == list(range(16))
    # on time but the second the flush fell in (10:00:11 was due 600 ms after it)
    lags = world.lags(every["id"])
    assert all(0 <= lags[t] <= ON_TIME_MS for t in lags if t != T0 + 11_000), lags
    assert 0 <= lags[T0 + 11_000] <= POLL_MS + ON_TIME_MS
    for timer in (later, cron, soon):
        assert all(0 <= lag <= ON_TIME_MS for lag in world.lags(timer["id"]).values())

    # and the recurring timer continues
    status = api.call("GET", f"/v1/timers/{every['id']}").body
    assert status["status"] == "active"
    assert parse_ms(status["next_fire_at"]) == (end // 1_000 + 1) * 1_000


def test_a_long_outage_catches_up_by_the_misfire_policy(world: World) -> None:
    """The service stopped for a minute (no fan-out, no migrator): the 60 s missed exceed the
    45 s misfire grace, so one catch-up fire stands for them (fire_once), then it goes on."""
    every = world.api.create(schedule={"type": "every", "seconds": 1})  # fire_once
    world.run_until(T0 + 10_400)
    world.clock.advance(60_000)
    world.run_until(T0 + 120_000)
    fires = world.fires_of(every["id"])
    assert max(fires.values()) == 1
    before = {t for t in fires if t <= T0 + 10_400}
    after = sorted(t for t in fires if t > T0 + 10_400)
    assert before == set(range(T0 + 1_000, T0 + 10_001, 1_000))
    # one catch-up fire, of the latest occurrence missed (10:01:10), then on schedule
    assert after == list(range(T0 + 70_000, world.clock() + 1, 1_000))


def test_a_steady_load_costs_about_one_run_per_bucket_and_second(world: World) -> None:
    """No wasted invocations: 20 timers every second over at most 8 buckets (one tenant's
    spread) - the fan-out starts a run only when a bucket has something due, and never a
    second one while the first is queued or going."""
    for _ in range(20):
        world.api.create(schedule={"type": "every", "seconds": 1})
    world.run_until(T0 + 30_000)
    fired = len(world.received)
    assert fired == 20 * 29 + sum(1 for b in world.received if parse_ms(b["scheduled_at"]) ==
                                  T0 + 30_000)  # fmt: skip
    assert world.triggers <= 8 * 31  # + each bucket's early run while it counted as cold
    assert world.fanout.report.invocations == world.triggers

"""Wiring: settings from the environment, clients, and the service, built once per cold start.

AWS clients find local endpoints through the standard ``AWS_ENDPOINT_URL*`` variables, so
nothing here knows whether it runs in AWS, in the local stack or under moto.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis

from timers import store, tenants
from timers.config import Settings
from timers.ratelimit import RateLimiter
from timers.redis_index import RedisIndex
from timers.service import TimerService
from timers.tenants import Tenant


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def redis_client(settings: Settings) -> Any:
    if settings.redis_cluster:  # ElastiCache Serverless speaks cluster mode
        return redis.RedisCluster.from_url(settings.redis_url, decode_responses=True)
    return redis.Redis.from_url(settings.redis_url, decode_responses=True)


@dataclass
class Runtime:
    settings: Settings
    service: TimerService
    rate_limiter: RateLimiter
    authenticate: Callable[[str | None], Tenant | None]
    redis: Any


def build_runtime(
    settings: Settings | None = None,
    clock: Callable[[], int] = wall_clock_ms,
    redis_conn: Any = None,
) -> Runtime:
    settings = settings or Settings.from_env()
    store.bind_tables(settings)
    tenants.bind_tables(settings)
    conn = redis_conn if redis_conn is not None else redis_client(settings)
    service = TimerService(
        timers=store.TimerStore(settings.due_shards),
        fires=store.FireStore(),
        idempotency=store.IdempotencyStore(),
        clock=clock,
        lookahead_ms=settings.lookahead_seconds * 1000,
        index=RedisIndex(conn, settings.bucket_count),
    )
    return Runtime(
        settings=settings,
        service=service,
        rate_limiter=RateLimiter(conn, clock),
        authenticate=tenants.authenticate,
        redis=conn,
    )

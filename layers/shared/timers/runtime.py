"""Wiring: settings from the environment, clients, and the service, built once per cold start.

AWS clients find local endpoints through the standard ``AWS_ENDPOINT_URL*`` variables, so
nothing here knows whether it runs in AWS, in the local stack or under moto.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

import redis

from timers.adapters import idempotency, tenants, timers_table, wakeups
from timers.adapters.claims import ClaimStore
from timers.adapters.failed_fires import DeliveryQueue, FailedFireStore
from timers.adapters.ratelimit import RateLimiter
from timers.adapters.redis_index import Lock, RedisIndex
from timers.adapters.tenants import CachedAuthenticator
from timers.adapters.timers_table import TimerStore
from timers.adapters.wakeups import WakeupStore
from timers.config import Settings
from timers.failures import FailedFireService
from timers.service import TimerService

if TYPE_CHECKING:  # the migrator's and fan-out's cores load in their own functions only
    from timers.fanout import FanoutDeps
    from timers.migrate import MigratorDeps

REDIS_TIMEOUT_S = 1.0  # every Redis call ends within this (the trigger budgets with it)
DAY_MS = 86_400_000


def quiet_root_logger(environ: Mapping[str, str]) -> None:
    """Lambda's JSON log format sets the root logger to ApplicationLogLevel (INFO, or DEBUG),
    where the text format left it at WARNING: botocore's and the layer's own ``logging`` lines
    would become new bytes on every invocation (at DEBUG, every AWS request). The root stays at
    WARNING; the functions' own lines go through powertools' Logger, whose level is LogLevel."""
    if environ.get("AWS_LAMBDA_LOG_LEVEL"):
        logging.getLogger().setLevel(logging.WARNING)


quiet_root_logger(os.environ)  # every function's handler module imports this one


class MetricsPort(Protocol):
    def add_metric(self, name: str, unit: Any, value: float) -> None: ...


def add_counts(
    metrics: MetricsPort, counts: Mapping[str, int], always: Collection[str] = ()
) -> None:
    """Count metrics of a run, those that are zero left out unless named in ``always`` (a
    heartbeat): a metric never published costs nothing ($0.30 a month each otherwise), a Sum
    over no data reads as none on the dashboard, and each value left out is ~40 log bytes."""
    for name, value in counts.items():
        if value or name in always:
            metrics.add_metric(name=name, unit="Count", value=value)


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def redis_client(settings: Settings) -> Any:
    options = {"decode_responses": True, "socket_timeout": REDIS_TIMEOUT_S,
               "socket_connect_timeout": REDIS_TIMEOUT_S}  # fmt: skip
    if settings.redis_cluster:  # ElastiCache Serverless speaks cluster mode
        return redis.RedisCluster.from_url(settings.redis_url, **options)
    return redis.Redis.from_url(settings.redis_url, **options)


def redis_time_ms(client: Any) -> int:
    """The reference clock: Redis ``TIME`` (seconds, microseconds) in epoch ms."""
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def bind_tables(settings: Settings) -> None:
    """Point the pynamodb models at this deployment's tables."""
    timers_table.bind(settings.timers_table)
    wakeups.bind(settings.wakeups_table)
    idempotency.bind(settings.idempotency_table)
    tenants.bind_tables(settings)


def monotonic_ms() -> int:
    """Elapsed time: what the trigger measures its clock offset with (a wall-clock step of the
    host cannot move it)."""
    return time.monotonic_ns() // 1_000_000


def stores(
    settings: Settings, clock: Callable[[], int] = wall_clock_ms
) -> tuple[TimerStore, ClaimStore, WakeupStore]:
    bind_tables(settings)
    return (
        TimerStore(settings.due_shards, clock=clock),
        ClaimStore(settings.claims_table, settings.fire_retention_days),
        WakeupStore(settings.due_shards, settings.fire_retention_days),
    )


def migrator_deps(
    settings: Settings,
    conn: Any,
    timers: TimerStore,
    claims: ClaimStore,
    wakeups: WakeupStore,
    **overrides: Any,
) -> MigratorDeps:
    """What a migrator run needs, from the settings and the stores (the handler's, or a test's
    own with ``overrides`` such as a smaller budget)."""
    from timers.migrate import MigratorDeps, ResumePositions  # not on the api's cold start

    deps = MigratorDeps(
        index=RedisIndex(conn, settings.bucket_count),
        timers=timers,
        claims=claims,
        wakeups=wakeups,
        positions=ResumePositions(conn),
        due_shards=settings.due_shards,
        lookahead_ms=settings.lookahead_seconds * 1000,
        retention_ms=settings.fire_retention_days * DAY_MS,
    )
    return replace(deps, **overrides)


def fanout_deps(
    settings: Settings,
    conn: Any,
    invoke: Callable[..., Any],
    clock: Callable[[], int],
    sleep: Callable[[float], None],
    **overrides: Any,
) -> FanoutDeps:
    """What a fan-out run needs: the handler's Lambda client and wall clock, or a test's
    recorder and injected clock (``overrides``: its own index, token source...)."""
    from timers.adapters.warmth import WarmthStore  # not on the api's cold start
    from timers.fanout import LOCK_KEY, LOCK_TTL_MS, FanoutDeps

    deps = FanoutDeps(
        index=RedisIndex(conn, settings.bucket_count),
        lock=Lock(conn, LOCK_KEY, LOCK_TTL_MS),
        invoke=invoke,
        trigger_function=settings.trigger_function_name,
        clock=clock,
        sleep=sleep,
        warmth=WarmthStore(conn),
    )
    return replace(deps, **overrides)


@dataclass
class Runtime:
    settings: Settings
    service: TimerService
    rate_limiter: RateLimiter
    authenticate: CachedAuthenticator
    redis: Any
    failures: FailedFireService


def build_runtime(
    settings: Settings | None = None,
    clock: Callable[[], int] = wall_clock_ms,
    redis_conn: Any = None,
) -> Runtime:
    settings = settings or Settings.from_env()
    timer_store, claims, wakeup_store = stores(settings, clock)
    conn = redis_conn if redis_conn is not None else redis_client(settings)
    service = TimerService(
        timers=timer_store,
        claims=claims,
        wakeups=wakeup_store,
        idempotency=idempotency.IdempotencyStore(),
        clock=clock,
        lookahead_ms=settings.lookahead_seconds * 1000,
        retention_ms=settings.fire_retention_days * DAY_MS,
        bucket_count=settings.bucket_count,
        index=RedisIndex(conn, settings.bucket_count),
        allow_loopback_targets=settings.timers_allow_loopback_targets,
    )
    return Runtime(
        settings=settings,
        service=service,
        rate_limiter=RateLimiter(conn, clock),
        authenticate=CachedAuthenticator(clock),
        redis=conn,
        failures=FailedFireService(
            failures=FailedFireStore(settings.failed_fires_table, settings.fire_retention_days),
            timers=timer_store,
            claims=claims,
            delivery_queue=DeliveryQueue(settings.delivery_queue_url),
            clock=clock,
        ),
    )

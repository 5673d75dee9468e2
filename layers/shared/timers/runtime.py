"""Wiring: every function's clients and cores, built once per cold start from the settings.

AWS clients find local endpoints through the standard ``AWS_ENDPOINT_URL*`` variables, so
nothing here knows whether it runs in AWS, in the local stack or under moto. The handlers
call one builder each (``api``, ``trigger``, ``migrator``, ``fanout``) and stay thin.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

import redis
from botocore.config import Config
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from timers.api.failures import FailedFireService
from timers.api.groups import GroupService
from timers.api.groups_table import GroupStore
from timers.api.idempotency import IdempotencyStore
from timers.api.service import TimerService
from timers.config import Settings
from timers.delivery.failed_fires import DeliveryQueue, FailedFireStore
from timers.delivery.records import DeliveryRecords
from timers.engine.changes import Changes, Checkpoints
from timers.engine.extra import Extras
from timers.engine.index import BucketIndex
from timers.engine.log import FireLog
from timers.engine.wake import WakeStore
from timers.store import aws
from timers.store.timers_table import TimerStore
from timers.tenancy.auth import CachedAuthenticator
from timers.tenancy.ratelimit import RateLimiter
from timers.tenancy.tenants import TenantStore
from timers.tenancy.usage import UsageCounters

if TYPE_CHECKING:  # the fan-out's, migrator's and trigger's cores load in their own functions
    from timers.engine.fanout import FanoutDeps
    from timers.engine.migrate import MigratorDeps
    from timers.engine.trigger import TriggerDeps

REDIS_TIMEOUT_S = 1.0  # one Redis call, retries included, ends within about this
DAY_MS = 86_400_000

# The trigger retries SQS and its claims itself (bounded; a record waits long: a record lost
# after its send is a duplicate), so its clients fail fast instead of stacking botocore's
# retries. These timeouts are the budgets (*_CALL_MS) in timers.engine.claim and .send.
SQS_CONFIG = Config(
    connect_timeout=1,
    read_timeout=8,
    max_pool_connections=16,
    retries={"max_attempts": 1, "mode": "standard"},
)
CLAIM_CONFIG = Config(
    connect_timeout=0.5,
    read_timeout=3,
    max_pool_connections=16,
    retries={"max_attempts": 1, "mode": "standard"},
)
CLAIM_TIMEOUTS = {
    "connect_timeout_seconds": 0.5,
    "read_timeout_seconds": 3,
    "max_retry_attempts": 0,
}
"""CLAIM_CONFIG for the trigger's pynamodb models (its timers' reads and checkpoints)."""
RECORD_CONFIG = Config(
    connect_timeout=0.5,
    read_timeout=8,
    max_pool_connections=16,
    retries={"max_attempts": 1, "mode": "standard"},
)
# Async invokes return at once; short timeouts and one retry keep a slow API from stalling the
# fan-out's polls (a run not started now is started by a later poll).
LAMBDA_CONFIG = Config(
    connect_timeout=1,
    read_timeout=2,
    max_pool_connections=16,
    retries={"max_attempts": 2, "mode": "standard"},
)


def quiet_root_logger(environ: Mapping[str, str]) -> None:
    """Lambda's JSON log format sets the root logger to ApplicationLogLevel; it stays at
    WARNING, so botocore's lines never become billed bytes. The functions' own lines go
    through powertools' Logger, whose level is LogLevel."""
    if environ.get("AWS_LAMBDA_LOG_LEVEL"):
        logging.getLogger().setLevel(logging.WARNING)


quiet_root_logger(os.environ)  # every function's handler module imports this one


class MetricsPort(Protocol):
    def add_metric(self, name: str, unit: Any, value: float) -> None: ...


def add_counts(
    metrics: MetricsPort, counts: Mapping[str, int], always: Collection[str] = ()
) -> None:
    """Count metrics, those that are zero left out unless named in ``always`` (a heartbeat): a
    metric never published costs nothing, and each value left out is ~40 log bytes."""
    for name, value in counts.items():
        if value or name in always:
            metrics.add_metric(name=name, unit="Count", value=value)


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def monotonic_ms() -> int:
    """Elapsed time: what the trigger keeps its clock offset with (a wall-clock step of the
    host cannot move it)."""
    return time.monotonic_ns() // 1_000_000


REDIS_RETRIES = {False: (1, 0.05), True: (2, 0.1)}
"""(retries, backoff cap in s) of a call: one quick retry on a dropped connection; in cluster
mode a second one after a failover or a redirection (the slots are refreshed in between)."""


def redis_attempt_timeout_s(cluster: bool) -> float:
    """Each attempt's socket timeout: all attempts and their backoffs fit REDIS_TIMEOUT_S."""
    retries, cap = REDIS_RETRIES[cluster]
    return (REDIS_TIMEOUT_S - retries * cap) / (retries + 1)


def redis_client(settings: Settings) -> Any:
    """A client whose every call ends within REDIS_TIMEOUT_S (retries included) before the
    caller sees the error - the trigger hands back, the migrator retries the bucket."""
    cluster = settings.redis_cluster
    timeout = redis_attempt_timeout_s(cluster)
    options: dict[str, Any] = {
        "decode_responses": True,
        "socket_timeout": timeout,
        "socket_connect_timeout": timeout,
    }
    retries, cap = REDIS_RETRIES[cluster]
    retry = Retry(ExponentialBackoff(cap=cap, base=cap / 5), retries)
    if cluster:  # ElastiCache cluster mode and Serverless
        return redis.RedisCluster.from_url(settings.redis_url, retry=retry, **options)
    return redis.Redis.from_url(settings.redis_url, retry=retry, **options)


def redis_time_ms(client: Any) -> int:
    """The reference clock: Redis ``TIME`` in epoch ms."""
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


@dataclass(frozen=True)
class Wiring:
    """What every fire-path function shares: the stores and the Redis index."""

    settings: Settings
    redis: Any
    index: BucketIndex
    timers: TimerStore
    log: FireLog
    wake: WakeStore
    checkpoints: Checkpoints
    changes: Changes


def wire(
    settings: Settings,
    clock: Callable[[], int] = wall_clock_ms,
    redis_conn: Any = None,
    dynamodb: Any = None,
    record_dynamodb: Any = None,
    sleep: Callable[[float], None] = time.sleep,
    timer_settings: Mapping[str, Any] | None = None,
) -> Wiring:
    conn = redis_conn if redis_conn is not None else redis_client(settings)
    index = BucketIndex(conn, settings.bucket_count)
    timers = TimerStore(settings.timers_table, clock=clock, **(timer_settings or {}))
    log = FireLog(settings.claims_table, settings.fire_retention_days, dynamodb, record_dynamodb)
    wake = WakeStore(settings.wakeups_table, settings.fire_retention_days, dynamodb)
    changes = Changes(
        timers,
        log,
        wake,
        index,
        clock,
        settings.lookahead_seconds * 1000,
        settings.fire_retention_days * DAY_MS,
        sleep,
    )
    return Wiring(
        settings, conn, index, timers, log, wake, Checkpoints(timers, wake, clock), changes
    )


def migrator_deps(w: Wiring, **overrides: Any) -> MigratorDeps:
    from timers.engine.migrate import MigratorDeps

    s = w.settings
    deps = MigratorDeps(
        w.index,
        w.timers,
        w.log,
        w.wake,
        w.checkpoints,
        lookahead_ms=s.lookahead_seconds * 1000,
        retention_ms=s.fire_retention_days * DAY_MS,
    )
    return replace(deps, **overrides)


def fanout_deps(
    w: Wiring,
    invoke: Callable[..., Any],
    clock: Callable[[], int],
    sleep: Callable[[float], None],
    **overrides: Any,
) -> FanoutDeps:
    from timers.engine.fanout import FanoutDeps

    s = w.settings
    deps = FanoutDeps(
        w.index,
        invoke,
        s.trigger_function_name,
        s.migrator_function_name,
        clock,
        sleep,
        concurrency=s.trigger_concurrency,
    )
    return replace(deps, **overrides)


def trigger_deps(w: Wiring, sqs: Any, **overrides: Any) -> TriggerDeps:
    from timers.engine.trigger import TriggerDeps

    s = w.settings
    deps = TriggerDeps(
        index=w.index,
        log=w.log,
        timers=w.timers,
        checkpoints=w.checkpoints,
        sqs=sqs,
        clock=wall_clock_ms,
        monotonic=monotonic_ms,
        reference=lambda: redis_time_ms(w.redis),
        lookahead_ms=s.lookahead_seconds * 1000,
        retention_ms=s.fire_retention_days * DAY_MS,
        sleep=time.sleep,
        delivery_queue_url=s.delivery_queue_url,
        usage=UsageCounters(s.claims_table, w.log.client),
    )
    return replace(deps, **overrides)


# ---------------------------------------------------------------- one builder per function


def trigger() -> tuple[Wiring, TriggerDeps]:
    w = wire(
        Settings.from_env(),
        dynamodb=aws.client("dynamodb", config=CLAIM_CONFIG),
        record_dynamodb=aws.client("dynamodb", config=RECORD_CONFIG),
        timer_settings=CLAIM_TIMEOUTS,
    )
    return w, trigger_deps(w, aws.client("sqs", config=SQS_CONFIG))


def migrator() -> MigratorDeps:
    return migrator_deps(wire(Settings.from_env()))


def fanout() -> FanoutDeps:
    invoke = aws.client("lambda", config=LAMBDA_CONFIG).invoke
    return fanout_deps(wire(Settings.from_env()), invoke, wall_clock_ms, time.sleep)


@dataclass
class Runtime:
    settings: Settings
    service: TimerService
    rate_limiter: RateLimiter
    authenticate: CachedAuthenticator
    tenants: TenantStore
    redis: Any
    failures: FailedFireService
    wiring: Wiring
    groups: GroupService


def build_runtime(
    settings: Settings | None = None,
    clock: Callable[[], int] = wall_clock_ms,
    redis_conn: Any = None,
    sleep: Callable[[float], None] = time.sleep,
    reference: Callable[[], int] | None = None,
) -> Runtime:
    """The api's: its service over the fire path's stores, and its failed-fires service.
    ``reference``: the reference clock run now fires by (default: Redis TIME, the trigger's)."""
    w = wire(settings or Settings.from_env(), clock, redis_conn, sleep=sleep)
    s = w.settings
    deliveries = DeliveryRecords(s.claims_table, s.fire_retention_days)
    sqs: list[Any] = []  # built on first use: most requests send nothing

    def sqs_client() -> Any:
        if not sqs:
            sqs.append(aws.client("sqs", config=SQS_CONFIG))
        return sqs[0]

    usage = UsageCounters(s.claims_table)
    group_store = GroupStore(s.groups_table)
    extras = Extras(
        w.log,
        w.timers,
        clock,
        reference or (lambda: redis_time_ms(w.redis)),
        sqs_client,
        s.delivery_queue_url,
        s.fire_retention_days * DAY_MS,
        sleep,
        usage=usage,
    )
    service = TimerService(
        w.changes,
        deliveries,
        IdempotencyStore(s.idempotency_table),
        clock,
        allow_loopback_targets=s.timers_allow_loopback_targets,
        local_stack=s.timers_local_stack,
        extras=extras,
        usage=usage,
        groups=group_store,
    )
    w.changes.moved = service.status_moved
    failures = FailedFireService(
        failures=FailedFireStore(s.failed_fires_table, s.fire_retention_days),
        timers=w.timers,
        log=w.log,
        records=deliveries,
        delivery_queue=DeliveryQueue(s.delivery_queue_url),
        clock=clock,
    )
    limiter = RateLimiter(w.redis, clock)
    tenants = TenantStore(s.tenants_table, clock)
    authenticate = CachedAuthenticator(clock, tenants.authenticate, tenants.revocation_count)
    groups = GroupService(w.changes, group_store, clock)
    return Runtime(s, service, limiter, authenticate, tenants, w.redis, failures, w, groups)

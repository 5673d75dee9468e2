"""Fan-out (EventBridge, every minute): tick each second, async-invoke the trigger per due
bucket. Thin: wire, compute the run's deadline, run, report. The loop: ``timers.fanout``."""

from __future__ import annotations

import time
from functools import cache
from typing import Any

import boto3
from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext
from botocore.config import Config

from timers.config import Settings
from timers.fanout import (
    INVOKE_WORKERS,
    LOCK_KEY,
    LOCK_TTL_MS,
    FanoutDeps,
    run_deadline,
    run_fanout,
)
from timers.redis_index import Lock, RedisIndex
from timers.runtime import redis_client, wall_clock_ms

logger = Logger()
metrics = Metrics()
tracer = Tracer()

# Async invokes return at once; short timeouts and one retry keep a slow API from stalling a
# tick past the lock TTL (work not invoked now stays due for the next tick).
LAMBDA_CONFIG = Config(
    connect_timeout=1,
    read_timeout=2,
    retries={"max_attempts": 2, "mode": "standard"},
    max_pool_connections=INVOKE_WORKERS,
)


@cache
def deps() -> FanoutDeps:
    """Clients and settings, built once per cold start (not at import)."""
    settings = Settings.from_env()
    conn = redis_client(settings)
    return FanoutDeps(
        index=RedisIndex(conn, settings.bucket_count),
        lock=Lock(conn, LOCK_KEY, LOCK_TTL_MS),
        marker=conn,
        invoke=boto3.client("lambda", config=LAMBDA_CONFIG).invoke,
        trigger_function=settings.trigger_function_name,
        clock=wall_clock_ms,
        sleep=time.sleep,
    )


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, int]:
    d = deps()
    start_ms = d.clock()
    deadline_ms = run_deadline(start_ms, context.get_remaining_time_in_millis())
    report = run_fanout(d, start_ms, deadline_ms)
    summary = report.summary()
    metrics.add_metric(name="FanoutTicks", unit=MetricUnit.Count, value=report.ticks)
    metrics.add_metric(name="FanoutSkipped", unit=MetricUnit.Count, value=report.skipped)
    metrics.add_metric(name="FanoutInvocations", unit=MetricUnit.Count, value=report.invocations)
    metrics.add_metric(
        name="FanoutFailedInvocations", unit=MetricUnit.Count, value=report.failed_invocations
    )
    metrics.add_metric(name="FanoutTickErrors", unit=MetricUnit.Count, value=report.errors)
    logger.info("fanout run", extra={**summary, "start_ms": start_ms, "deadline_ms": deadline_ms})
    return summary

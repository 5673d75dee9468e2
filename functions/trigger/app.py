"""Trigger (async-invoked by the fan-out per due bucket): fire one batch of the bucket.

Thin: parse the event, wire the clients once per cold start, run, report. The fire path lives
in ``timers.firing``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import cache
from typing import Any

import boto3
from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext
from botocore.config import Config

from timers.config import Settings
from timers.firing import (
    LAG_BUCKETS,
    LAG_OVER,
    SEND_WORKERS,
    TriggerDeps,
    TriggerReport,
    run_trigger,
)
from timers.redis_index import RedisIndex
from timers.runtime import redis_client, wall_clock_ms
from timers.store import FireClaims, TimerStore, bind_tables

logger = Logger()
metrics = Metrics()
tracer = Tracer()

# The trigger retries SQS itself (bounded, with backoff, then records the fire failed), so the
# client fails fast instead of stacking botocore's retries on top; one connection per lane.
SQS_CONFIG = Config(
    connect_timeout=1,
    read_timeout=3,
    retries={"max_attempts": 1, "mode": "standard"},
    max_pool_connections=SEND_WORKERS,
)


@dataclass(frozen=True)
class TriggerEvent:
    bucket: int
    tick_ms: int | None  # the fan-out tick that asked for this run

    @classmethod
    def parse(cls, event: dict[str, Any]) -> TriggerEvent:
        bucket = event.get("bucket")
        tick = event.get("tick_ms")
        if isinstance(bucket, bool) or not isinstance(bucket, int) or bucket < 0:
            raise ValueError(f"event needs a non-negative int 'bucket', got {bucket!r}")
        return cls(bucket, tick if isinstance(tick, int) and not isinstance(tick, bool) else None)


@cache
def deps() -> TriggerDeps:
    """Clients and settings, built once per cold start (not at import)."""
    settings = Settings.from_env()
    bind_tables(settings)
    return TriggerDeps(
        index=RedisIndex(redis_client(settings), settings.bucket_count),
        sqs=boto3.client("sqs", config=SQS_CONFIG),
        timers=TimerStore(settings.due_shards),
        fires=FireClaims(settings.fire_retention_days),
        clock=wall_clock_ms,
        lookahead_ms=settings.lookahead_seconds * 1000,
        sleep=time.sleep,
    )


def emit_metrics(report: TriggerReport, invoke_delay_ms: int | None) -> None:
    count = MetricUnit.Count
    metrics.add_metric(name="FiresEnqueued", unit=count, value=report.enqueued)
    metrics.add_metric(name="FiresFailed", unit=count, value=report.failed)
    metrics.add_metric(name="FiresSkipped", unit=count, value=report.skipped)
    metrics.add_metric(name="MembersStale", unit=count, value=report.stale)
    metrics.add_metric(name="FiresHeld", unit=count, value=report.held)
    metrics.add_metric(name="LeasesReclaimed", unit=count, value=report.reclaimed)
    buckets = report.lag_buckets()
    for name in [name for _, name in LAG_BUCKETS] + [LAG_OVER]:
        metrics.add_metric(name=f"FireLag_{name}", unit=count, value=buckets[name])
    if report.lags_ms:  # one value per run: EMF caps a metric at 100 values
        metrics.add_metric(
            name="FireLagMaxMs", unit=MetricUnit.Milliseconds, value=max(report.lags_ms)
        )
    if invoke_delay_ms is not None:
        metrics.add_metric(
            name="InvokeDelayMs", unit=MetricUnit.Milliseconds, value=invoke_delay_ms
        )


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    request = TriggerEvent.parse(event)
    d = deps()
    started_ms = d.clock()
    report = run_trigger(d, request.bucket)
    delay = None if request.tick_ms is None else started_ms - request.tick_ms
    emit_metrics(report, delay)
    summary = report.summary()
    if report.failures:
        logger.warning("fires failed", extra={"failures": report.failures[:20]})
    logger.info("trigger run", extra={**summary, "invoke_delay_ms": delay})
    return summary

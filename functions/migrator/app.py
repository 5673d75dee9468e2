"""Migrator (EventBridge, every minute): due index (DynamoDB) -> Redis buckets. Thin: wire, run,
report. What a run does and why it is bounded: ``timers.migrate``."""

from __future__ import annotations

from dataclasses import asdict
from functools import cache
from typing import Any

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from timers import store
from timers.config import Settings
from timers.migrate import MigrationReport, MigratorDeps, ResumePositions, run_migrator
from timers.redis_index import RedisIndex
from timers.runtime import redis_client, wall_clock_ms

logger = Logger()
metrics = Metrics()
tracer = Tracer()


@cache
def deps() -> MigratorDeps:
    """Clients and settings, built once per cold start (not at import)."""
    settings = Settings.from_env()
    store.bind_tables(settings)
    conn = redis_client(settings)
    return MigratorDeps(
        index=RedisIndex(conn, settings.bucket_count),
        positions=ResumePositions(conn),
        due_shards=settings.due_shards,
        lookahead_ms=settings.lookahead_seconds * 1000,
    )


def clock() -> int:
    return wall_clock_ms()


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    report: MigrationReport = run_migrator(deps(), clock())
    metrics.add_metric(name="MigratorRead", unit=MetricUnit.Count, value=report.read)
    metrics.add_metric(name="MigratorAdded", unit=MetricUnit.Count, value=report.added)
    metrics.add_metric(
        name="MigratorBudgetHitShards", unit=MetricUnit.Count, value=report.budget_hit_shards
    )
    if report.budget_hit_shards:  # the window holds more than one run reads: raise the budget
        logger.warning("migrator budget reached; the rest follows next run", extra=asdict(report))
    else:
        logger.info("migrator run", extra=asdict(report))
    return asdict(report)

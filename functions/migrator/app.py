"""Migrator (EventBridge, every minute): make sure every timer due within the look-ahead is in
Redis. Thin: wire, run, report once. What a run does and why it is bounded: ``timers.migrate``."""

from __future__ import annotations

from functools import cache
from typing import Any

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.utilities.typing import LambdaContext

from timers.config import Settings
from timers.migrate import MigrationReport, MigratorDeps, run_migrator
from timers.runtime import add_counts, migrator_deps, redis_client, stores, wall_clock_ms

logger = Logger()
metrics = Metrics()


@cache
def deps() -> MigratorDeps:
    """Clients and settings, built once per cold start (not at import)."""
    settings = Settings.from_env()
    return migrator_deps(settings, redis_client(settings), *stores(settings))


def clock() -> int:
    return wall_clock_ms()


def emit_metrics(report: MigrationReport) -> None:
    """Rows read (every run: a heartbeat); members put back and budget hits when any."""
    counts = {
        "MigratorRead": report.read,
        "MigratorAdded": report.added,
        "MigratorBudgetHitShards": report.budget_hit_shards,
    }
    add_counts(metrics, counts, always={"MigratorRead"})


@logger.inject_lambda_context
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    report = run_migrator(deps(), clock())
    emit_metrics(report)
    summary = report.summary()
    if report.budget_hit_shards:  # the window holds more than one run reads: raise the budget
        logger.warning("migrator budget reached; the rest follows next run", extra=summary)
    else:
        logger.info("migrator run", extra=summary)
    return summary

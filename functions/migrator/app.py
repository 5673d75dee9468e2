"""Migrator (EventBridge, every minute; and invoked by the fan-out to restore lost buckets):
make sure every timer due within the look-ahead is in Redis. Thin: wire, run, report once.
What a run does and why it is bounded: ``timers.engine.migrate``."""

from __future__ import annotations

from functools import cache
from typing import Any

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.utilities.typing import LambdaContext

from timers import runtime
from timers.engine.migrate import MigrationReport, MigratorDeps, run_migrator

logger = Logger()
metrics = Metrics()


@cache
def deps() -> MigratorDeps:
    """Clients and settings, built once per cold start (not at import)."""
    return runtime.migrator()


def restore_buckets(event: dict[str, Any]) -> list[int] | None:
    """The buckets the fan-out asked to restore (``{"restore": [..]}``), or None: every one."""
    buckets = event.get("restore")
    if buckets is None:
        return None
    if not isinstance(buckets, list) or not all(isinstance(b, int) and b >= 0 for b in buckets):
        raise ValueError(f"'restore' must be a list of bucket numbers, got {buckets!r}")
    return buckets


def emit_metrics(report: MigrationReport) -> None:
    """Listings read (every run: a heartbeat); cards put back, budget hits, failed buckets and
    restores when any."""
    counts = {
        "MigratorRead": report.read,
        "MigratorAdded": report.added,
        "MigratorBudgetHitBuckets": report.budget_hit_buckets,
        "MigratorFailedBuckets": report.failed_buckets,
        "BucketsRestored": report.restored_buckets,
    }
    runtime.add_counts(metrics, counts, always={"MigratorRead"})


@logger.inject_lambda_context
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    d = deps()
    report = run_migrator(d, d.clock(), restore_buckets(event or {}))
    emit_metrics(report)
    summary = report.summary()
    if report.budget_hit_buckets or report.failed_buckets:
        logger.warning("migrator run left work for the next one", extra=summary)
    else:
        logger.info("migrator run", extra=summary)
    return summary

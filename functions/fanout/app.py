"""Fan-out (EventBridge, every minute): for a minute, start each bucket's trigger run shortly
before its earliest card falls due, and hand a lost bucket to the migrator. Thin: wire, compute
the run's deadline, run, report once. The loop: ``timers.engine.fanout``."""

from __future__ import annotations

from functools import cache
from typing import Any

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.utilities.typing import LambdaContext

from timers import runtime
from timers.engine.fanout import FanoutDeps, FanoutReport, run_deadline, run_fanout

logger = Logger()
metrics = Metrics()


@cache
def deps() -> FanoutDeps:
    """Clients and settings, built once per cold start (not at import)."""
    return runtime.fanout()


def emit_metrics(report: FanoutReport) -> None:
    """Trigger runs started (every run: a heartbeat), and failures and restores when any."""
    counts = {
        "FanoutInvocations": report.invocations,
        "FanoutFailedInvocations": report.failed_invocations,
        "FanoutErrors": report.errors,
        "BucketsLost": report.restores,
    }
    runtime.add_counts(metrics, counts, always={"FanoutInvocations"})


@logger.inject_lambda_context
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, int]:
    d = deps()
    start_ms = d.clock()
    deadline_ms = run_deadline(start_ms, context.get_remaining_time_in_millis())
    report = run_fanout(d, start_ms, deadline_ms)
    emit_metrics(report)
    summary = report.summary()
    logger.info("fanout run", extra={**summary, "start_ms": start_ms, "deadline_ms": deadline_ms})
    return summary

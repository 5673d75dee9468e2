"""Fan-out (EventBridge, every minute): for a minute, start each bucket's trigger run shortly
before its earliest member falls due. Thin: wire, compute the run's deadline, run, report once.
The loop: ``timers.fanout``."""

from __future__ import annotations

import time
from functools import cache
from typing import Any

import boto3
from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.utilities.typing import LambdaContext
from botocore.config import Config

from timers.config import Settings
from timers.fanout import INVOKE_WORKERS, FanoutDeps, FanoutReport, run_deadline, run_fanout
from timers.runtime import add_counts, fanout_deps, redis_client, wall_clock_ms

logger = Logger()
metrics = Metrics()

# Async invokes return at once; short timeouts and one retry keep a slow API from stalling the
# polls (a run not started now is started by a later poll or the sweep).
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
    invoke = boto3.client("lambda", config=LAMBDA_CONFIG).invoke
    return fanout_deps(settings, redis_client(settings), invoke, wall_clock_ms, time.sleep)


def emit_metrics(report: FanoutReport) -> None:
    """Trigger runs started (every run: a heartbeat), and failures when there were any."""
    counts = {
        "FanoutInvocations": report.invocations,
        "FanoutFailedInvocations": report.failed_invocations,
        "FanoutErrors": report.errors,
    }
    add_counts(metrics, counts, always={"FanoutInvocations"})


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

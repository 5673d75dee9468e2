"""Trigger (async-invoked by the fan-out per bucket): fire the bucket's due cards on time.

Thin: parse the event, wire the clients once per cold start, run with the invocation's
deadline, report once. The fire path lives in ``timers.engine.trigger``. A cold start (the
sandbox's first invocation, invoked before the sandbox had initialized) folds its
invoke-to-handler delay into its bucket's estimate, which the fan-out leads cold buckets by.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from functools import cache
from typing import Any

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from timers import runtime
from timers.core.lag import LAG_LEVELS, lag_level
from timers.engine import keys
from timers.engine.fanout import cold_start_sample, next_cold_estimate
from timers.engine.trigger import RunMarker, TriggerDeps, TriggerReport, run_trigger
from timers.runtime import Wiring

logger = Logger()
metrics = Metrics()
LATE_MS = 100  # a fire sent later than this after its due time counts as late (FiresLate)
INITIALIZED_MS = runtime.wall_clock_ms()  # this sandbox's imports are done (all but wiring)
_first_invocation = True  # only a sandbox's first invocation can have waited for its init


@dataclass(frozen=True)
class TriggerEvent:
    bucket: int
    marker: RunMarker | None  # the fan-out's run marker (absent for a hand-made invoke)
    at_ms: int | None  # when the fan-out asked

    @classmethod
    def parse(cls, event: dict[str, Any]) -> TriggerEvent:
        bucket = _int(event.get("bucket"))
        if bucket is None or bucket < 0:
            raise ValueError(f"event needs a non-negative int 'bucket', got {event!r}")
        slot, token = _int(event.get("slot")), event.get("token")
        marker = RunMarker(slot, token) if slot is not None and isinstance(token, str) else None
        return cls(bucket, marker, _int(event.get("at_ms")))


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@cache
def wired() -> tuple[Wiring, TriggerDeps]:
    """Clients and settings, built once per cold start (not at import)."""
    return runtime.trigger()


def record_cold_start(bucket: int, sample_ms: int) -> None:
    """Fold this sandbox's cold start into its bucket's estimate (a decaying peak; a race
    between two cold starts loses one sample: it is a hint)."""
    index = wired()[0].index
    previous = index.field(bucket, keys.COLD)
    estimate = next_cold_estimate(None if previous is None else int(previous), sample_ms)
    index.set_field(bucket, keys.COLD, estimate)


def emit_metrics(report: TriggerReport, invoke_delay_ms: int | None) -> None:
    """One EMF block per run: the few numbers an operator alarms on, counts only when not
    zero (a lone fire's block is most of its log bytes)."""
    # One value per fire, so the dashboard's and the alarm's p50/p99/max are per fire, not per
    # run (a percentile of run maxima is not one of fires). Powertools prints a block every 100
    # values (5 to 8 log bytes a fire); first, so the counters below always end the last one.
    for lag in report.lags_ms:
        metrics.add_metric(name="FireLagMs", unit=MetricUnit.Milliseconds, value=lag)
    levels = Counter(lag_level(lag) for lag in report.lags_ms)
    counts = {
        "FiresEnqueued": report.enqueued,
        "FiresFailed": report.failed,
        "FiresLate": sum(1 for lag in report.lags_ms if lag > LATE_MS),
        # the sends by accuracy level (timers.core.lag) of their FireLagMs: a stacked widget
        **{f"FiresLag_{level}": levels[level] for level in LAG_LEVELS},
        # the duplicate window
        "SendsAmbiguous": report.ambiguous,
        "FiresUnrecorded": report.unrecorded,
        "ClaimsTakenOver": report.taken_over,
        "FiresHandedBack": report.handed_back,
        "ClockRefusals": report.refused,
    }
    runtime.add_counts(metrics, counts)
    if invoke_delay_ms is not None:
        metrics.add_metric(
            name="InvokeDelayMs", unit=MetricUnit.Milliseconds, value=invoke_delay_ms
        )


@logger.inject_lambda_context
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    global _first_invocation
    request = TriggerEvent.parse(event)
    d = wired()[1]
    started_ms = d.clock()
    cold_ms = cold_start_sample(request.at_ms, INITIALIZED_MS, started_ms)
    cold_ms, _first_invocation = (cold_ms if _first_invocation else None), False
    report = run_trigger(d, request.bucket, context.get_remaining_time_in_millis(), request.marker)
    delay = None if request.at_ms is None else started_ms - request.at_ms
    if cold_ms is not None:  # after the run: the fires do not wait for it
        try:
            record_cold_start(request.bucket, cold_ms)
        except Exception:  # the estimate is a hint; a Redis blip must not fail the run
            logger.exception("cold start not recorded")
    emit_metrics(report, delay)
    # One short line per run (CloudWatch bills its bytes): the counters that are not zero, the
    # request id; the log group already names the function.
    logger.remove_keys(["function_arn", "function_name", "function_memory_size", "location"])
    line: dict[str, Any] = {k: v for k, v in report.summary().items() if v or k == "bucket"}
    if report.failures:
        line["failures_sample"] = report.failures[:5]
    logger.info("trigger run", extra={**line, "invoke_delay_ms": delay, "cold_start_ms": cold_ms})
    return report.summary()

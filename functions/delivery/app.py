"""Delivery (SQS event sources on the delivery queue and its redrive queue): POST each fire to
its HTTP target; settle what SQS gave up on.

Thin: turn the batch into messages, deliver them (``timers.delivery``), set the visibility
timeout of each message to retry, and answer with the batch item failures through powertools'
batch utility (``ReportBatchItemFailures``): a delivered, failed or deferred (sent again with a
delay) message is deleted, one to retry comes back when its visibility timeout ends. A batch
from the redrive queue (messages the function kept failing on) is settled instead: each fire
fails ``dead_lettered`` and its message goes on to the dead-letter queue.
"""

from __future__ import annotations

import time
from functools import cache
from typing import Any

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.batch import (
    BatchProcessor,
    EventType,
    process_partial_response,
)
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
from aws_lambda_powertools.utilities.typing import LambdaContext
from botocore.config import Config

from timers.config import Settings
from timers.delivery import http_target
from timers.delivery.batches import deliver_batch, settle_batch
from timers.delivery.decisions import DeliveryDeps
from timers.delivery.failed_fires import FailedFireStore
from timers.delivery.messages import BatchReport, Message, dead_letter_body, requeue_body, summary
from timers.delivery.records import DeliveryRecords
from timers.delivery.target_slots import TargetSlots
from timers.runtime import wall_clock_ms
from timers.store import aws
from timers.tenancy.tenants import TenantStore
from timers.tenancy.usage import UsageCounters

logger = Logger()
metrics = Metrics()
# A batch whose every message is retried is an answer, not a failed invocation.
processor = BatchProcessor(event_type=EventType.SQS, raise_on_entire_batch_failure=False)

AWS_CONFIG = Config(
    connect_timeout=1,
    read_timeout=5,
    retries={"max_attempts": 3, "mode": "standard"},
    max_pool_connections=16,
)
SECRETS_CACHE_MS = 60_000
"""A sandbox re-reads a tenant's signing secrets this often (a rotation window is far longer)."""


class _SecretCache:
    def __init__(self, tenants: TenantStore) -> None:
        self._tenants = tenants
        self._seen: dict[str, tuple[int, list[str]]] = {}

    def __call__(self, tenant: str) -> list[str]:
        now = wall_clock_ms()
        seen = self._seen.get(tenant)
        if seen is None or now - seen[0] > SECRETS_CACHE_MS:
            seen = (now, self._tenants.signing_secrets(tenant, now))
            self._seen[tenant] = seen
        return seen[1]


@cache
def settings() -> Settings:
    return Settings.from_env()


@cache
def sqs() -> Any:
    return aws.client("sqs", config=AWS_CONFIG)


@cache
def deps() -> DeliveryDeps:
    """Clients and settings, built once per cold start (not at import)."""
    settings_ = settings()
    dynamodb = aws.client("dynamodb", config=AWS_CONFIG)
    allow_loopback = settings_.timers_allow_loopback_targets

    def dead_letter(message: Message, reason: str) -> None:
        queue = settings_.delivery_dlq_url
        sqs().send_message(QueueUrl=queue, **dead_letter_body(message, reason))

    def requeue(message: Message, delay_s: int) -> None:
        queue = settings_.delivery_queue_url
        sqs().send_message(QueueUrl=queue, **requeue_body(message, delay_s))

    return DeliveryDeps(
        records=DeliveryRecords(settings_.claims_table, settings_.fire_retention_days, dynamodb),
        slots=TargetSlots(
            settings_.claims_table,
            per_origin=settings_.webhook_target_concurrency,
            per_tenant=settings_.webhook_tenant_concurrency,
            client=dynamodb,
        ),
        secrets=_SecretCache(TenantStore(settings_.tenants_table)),
        post=lambda url, body, headers: http_target.post(
            url, body, headers, allow_loopback=allow_loopback
        ),
        dead_letter=dead_letter,
        requeue=requeue,
        failed_fires=FailedFireStore(
            settings_.failed_fires_table, settings_.fire_retention_days, dynamodb
        ),
        clock=wall_clock_ms,
        usage=UsageCounters(settings_.claims_table, dynamodb),
    )


def _redriven(records: list[dict[str, Any]]) -> bool:
    """Is this batch from the redrive queue? (An event holds one event source's records.)"""
    queue = settings().delivery_redrive_queue_url.rsplit("/", 1)[-1]
    source = str(records[0].get("eventSourceARN", "")) if records else ""
    return bool(queue) and source.rsplit(":", 1)[-1] == queue


def _retry_later(record: SQSRecord, seconds: int) -> None:
    """Set when SQS hands the message out again (at most 12 h: SQS's limit)."""
    sqs().change_message_visibility(
        QueueUrl=settings().delivery_queue_url,
        ReceiptHandle=record.receipt_handle,
        VisibilityTimeout=min(seconds, 43_200),
    )


@logger.inject_lambda_context
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    started = time.monotonic()
    records = event.get("Records") or []
    messages = [Message.from_record(r) for r in records]
    work = settle_batch if _redriven(records) else deliver_batch
    report: BatchReport = work(messages, deps())

    def record_handler(record: SQSRecord) -> None:
        outcome = report.outcomes.get(record.message_id)
        if outcome is None or outcome.verdict == "error":
            raise RuntimeError("not handled; back after the visibility timeout")
        if outcome.retry_in_s is not None:
            _retry_later(record, outcome.retry_in_s)
            raise RuntimeError(f"{outcome.verdict} for {outcome.retry_in_s} s")

    response = process_partial_response(event, record_handler, processor, context)
    counts = summary(report)
    for name, value in counts.items():
        metrics.add_metric(name=f"Webhooks_{name}", unit=MetricUnit.Count, value=value)
    logger.info("delivery batch", extra={**counts, "ms": int((time.monotonic() - started) * 1000)})
    return dict(response)

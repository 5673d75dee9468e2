"""Sending callbacks to SQS: the contract's message, batches of 10 per queue, lanes, retries.

A dead or forbidden queue fails its fires at once (recorded ``failed`` with the reason);
throttling and server errors are retried with backoff; each queue's batches run in lanes of
their own, so one tenant's slow or dead queue never holds up another's. Every attempt first
asks ``may_attempt`` (the trigger's deadline and never-early guard): an attempt it refuses
leaves its fires unsent, and the trigger hands them back.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionClosedError,
    ReadTimeoutError,
)

from timers.core.timer import Timer, fire_id
from timers.core.times import format_ms

SEND_ATTEMPTS = 4
"""Tries per SendMessageBatch entry on throttling or server errors before recording failed."""

SEND_BACKOFF_S = 0.05
"""First retry delay, doubled per retry: 50 + 100 + 200 ms keeps a bad queue's lane short."""

LANE_BATCHES = 10
"""SendMessageBatch calls per lane (100 messages): a big queue gets several lanes."""

SEND_WORKERS = 16
"""Concurrent lanes: one tenant's slow or dead queue holds one lane, not the others."""

SQS_BATCH_BYTES = 250_000
"""Payload bytes per SendMessageBatch (SQS caps a batch at 256 KiB; payloads reach 64 KiB)."""

# Whole-call SQS errors that retrying cannot fix (the queue is gone or we may not send to it).
PERMANENT_SQS_ERRORS = frozenset(
    {
        "AWS.SimpleQueueService.NonExistentQueue",
        "QueueDoesNotExist",
        "AccessDenied",
        "AccessDeniedException",
        "InvalidAddress",
        "InvalidSecurity",
        "KmsAccessDenied",
        "KMS.AccessDeniedException",
        "KmsDisabled",
        "KMS.DisabledException",
        "KmsNotFound",
        "KMS.NotFoundException",
        "AWS.SimpleQueueService.UnsupportedOperation",
        "UnsupportedOperation",
    }
)


class SqsPort(Protocol):
    """boto3's SQS client, as far as sending uses it."""

    def send_message_batch(self, *, QueueUrl: str, Entries: Sequence[Any]) -> Any: ...


@dataclass
class Delivery:
    """One callback on its way: what to send, and how it went."""

    timer: Timer
    fire_ms: int  # the occurrence fired (scheduled_at)
    fired_ms: int = 0  # fired_at, stamped per attempt
    enqueued_ms: int | None = None
    failure: str | None = None
    ref: tuple[str, str] | None = None  # the claim entry (HTTP targets: the delivery record's)

    @property
    def id(self) -> str:
        return fire_id(self.timer.id, self.fire_ms)

    @property
    def settled(self) -> bool:
        return self.enqueued_ms is not None or self.failure is not None


def callback_body(timer: Timer, fire_ms: int, fired_ms: int) -> str:
    """The contract's callback JSON; the stored payload text is embedded as-is (verbatim)."""
    head = json.dumps(
        {
            "fire_id": fire_id(timer.id, fire_ms),
            "timer_id": timer.id,
            "tenant": timer.tenant,
            "name": timer.name,
            "scheduled_at": format_ms(fire_ms),
            "fired_at": format_ms(fired_ms),
        },
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return f'{head[:-1]},"payload":{timer.payload_json}}}'


class _PermanentSendError(Exception):
    """The target queue cannot take messages at all (gone, access denied)."""


@dataclass
class Sender:
    sqs: SqsPort
    clock: Callable[[], int]  # the reference time (fired_at, enqueued_at)
    sleep: Callable[[float], None]
    may_attempt: Callable[[Sequence[Delivery]], bool]
    ambiguous: int = 0  # attempts whose outcome is unknown (SQS may have taken them): retried
    delivery_queue_url: str = ""  # HTTP targets' fires go to this queue (the delivery function)

    def send(self, deliveries: Sequence[Delivery]) -> None:
        """Send every callback; sets ``enqueued_ms`` or ``failure`` on each one sent."""
        by_queue: dict[str, list[Delivery]] = {}
        for d in deliveries:
            if d.timer.webhook is not None and not self.delivery_queue_url:
                d.failure = "no delivery queue configured for HTTP targets"
                continue
            queue = self.delivery_queue_url if d.timer.webhook else d.timer.target_queue_url
            by_queue.setdefault(queue, []).append(d)
        lanes: list[tuple[str, list[list[Delivery]]]] = []
        for queue_url, queued in by_queue.items():
            batches = batched(queued)
            lanes += [
                (queue_url, batches[i : i + LANE_BATCHES])
                for i in range(0, len(batches), LANE_BATCHES)
            ]
        if not lanes:
            return
        dead: dict[str, str] = {}  # queue url -> permanent failure, shared by its lanes

        def run_lane(queue_url: str, batches: list[list[Delivery]]) -> None:
            for batch in batches:
                if queue_url in dead:
                    for d in batch:
                        d.failure = dead[queue_url]
                    continue
                try:
                    if not self._send_batch(queue_url, batch):
                        return  # refused: the rest of the lane stays unsent
                except _PermanentSendError as exc:
                    dead[queue_url] = str(exc)
                    for d in batch:
                        d.failure = str(exc)

        with ThreadPoolExecutor(min(SEND_WORKERS, len(lanes))) as pool:
            for future in [pool.submit(run_lane, url, batches) for url, batches in lanes]:
                future.result()

    def _send_batch(self, queue_url: str, batch: list[Delivery]) -> bool:
        """One SendMessageBatch with bounded retries of throttled or failed entries. Returns
        False if ``may_attempt`` refused an attempt (what is pending stays unsent)."""
        fifo = queue_url.endswith(".fifo")
        pending = dict(enumerate(batch))
        delay = SEND_BACKOFF_S
        last_error = "not sent"
        for attempt in range(SEND_ATTEMPTS):
            if attempt:
                self.sleep(delay)
                delay *= 2
            if not self.may_attempt(list(pending.values())):
                return False
            fired_ms = self.clock()
            for d in pending.values():
                d.fired_ms = fired_ms
            try:
                response = self.sqs.send_message_batch(
                    QueueUrl=queue_url, Entries=[_entry(d, i, fifo) for i, d in pending.items()]
                )
            except ClientError as exc:
                error = exc.response.get("Error", {})
                code = str(error.get("Code", "ClientError"))
                last_error = f"{code}: {error.get('Message', '')}".strip()
                if code in PERMANENT_SQS_ERRORS:
                    raise _PermanentSendError(last_error) from exc
                continue
            except BotoCoreError as exc:  # connection reset, timeout: retryable
                # After a read timeout or a dropped connection SQS may have taken the batch:
                # the retry is the documented duplicate window, so it is counted.
                self.ambiguous += isinstance(exc, ReadTimeoutError | ConnectionClosedError)
                last_error = f"{type(exc).__name__}: {exc}"
                continue
            enqueued_ms = self.clock()
            for ok in response.get("Successful", []):
                pending.pop(int(ok["Id"][1:])).enqueued_ms = enqueued_ms
            for bad in response.get("Failed", []):
                reason = f"{bad.get('Code', 'Failed')}: {bad.get('Message', '')}".strip()
                if bad.get("SenderFault"):  # the message itself is unacceptable
                    pending.pop(int(bad["Id"][1:])).failure = reason
                else:
                    last_error = reason
            if not pending:
                return True
        for d in pending.values():
            d.failure = f"gave up after {SEND_ATTEMPTS} attempts: {last_error}"
        return True


def batched(deliveries: Sequence[Delivery]) -> list[list[Delivery]]:
    """SendMessageBatch groups: at most 10 entries and SQS_BATCH_BYTES of payload each."""
    batches: list[list[Delivery]] = []
    size = 0
    for d in deliveries:
        need = len(d.timer.payload_json.encode()) + 1_024  # body envelope + attribute
        if d.timer.webhook is not None:
            need += len(d.timer.webhook.to_json().encode()) + 256  # the delivery attributes
        if not batches or len(batches[-1]) == 10 or size + need > SQS_BATCH_BYTES:
            batches.append([])
            size = 0
        batches[-1].append(d)
        size += need
    return batches


def _entry(d: Delivery, index: int, fifo: bool) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "Id": f"m{index}",
        "MessageBody": callback_body(d.timer, d.fire_ms, d.fired_ms),
        "MessageAttributes": {"fire_id": {"DataType": "String", "StringValue": d.id}},
    }
    if d.timer.webhook is not None and d.ref is not None:
        # The body is exactly what the delivery function POSTs; where to, and whose, rides in
        # attributes (docs/webhooks.md).
        attributes = entry["MessageAttributes"]
        for name, value in (
            ("target", d.timer.webhook.to_json()),
            ("tenant", d.timer.tenant),
            ("claim", f"{d.ref[0]} {d.ref[1]}"),
            *([("retry", d.timer.retry.to_json())] if d.timer.retry else []),
        ):
            attributes[name] = {"DataType": "String", "StringValue": value}
    if fifo:
        entry["MessageDeduplicationId"] = d.id
        entry["MessageGroupId"] = d.timer.id
    return entry

"""The delivery function's work: POST each webhook message of a batch, decide what comes next.

A message on the delivery queue is one fire of an HTTP target (the trigger put it there): its
body is the callback exactly as it is POSTed, its attributes say where to (``target``), whose
it is (``tenant``, for the signing secrets) and which claim entry it belongs to (``claim``).

Per message: read the fire's delivery record (a settled one means this is a duplicate: drop
it); take a slot of the target's concurrency cap (none free: put the message back for a few
seconds, no attempt counted); sign and POST; count the attempt in the record; then

- 2xx: delivered - the message is deleted;
- 408, 429, 5xx, timeout, connection error: retried - the message's visibility timeout is set
  to the backoff and it is reported as a batch item failure, so SQS hands it out again then;
  once the first attempt is RETRY_FOR_MS old the fire fails instead;
- anything else (3xx, other 4xx, a blocked address): failed at once.

A failed fire's message is sent to the dead-letter queue (with the reason) and deleted; the
queue's redrive policy to the same DLQ remains as a backstop for a message the function itself
keeps failing on. Messages of one batch are handled concurrently, so a slow target delays only
its own messages.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from timers.core.chain import EntryRef
from timers.core.webhooks import (
    RETRY_FOR_MS,
    Attempt,
    DeliveryState,
    Webhook,
    gives_up,
    retry_wait_s,
    signed_headers,
    verdict,
)

log = logging.getLogger(__name__)

DEFER_S = (1, 4)
"""A message whose target is at its concurrency cap comes back after this many seconds."""

BATCH_WORKERS = 10  # one per message of a full SQS batch


class DeliveryRecords(Protocol):
    def read_delivery(self, ref: EntryRef) -> DeliveryState | None: ...
    def write_delivery(
        self, ref: EntryRef, state: DeliveryState, previous: DeliveryState | None
    ) -> bool: ...


class Slots(Protocol):
    def acquire(self, origin: str, now_ms: int) -> str | None: ...
    def release(self, key: str) -> None: ...


@dataclass(frozen=True)
class Message:
    """One SQS record, as much of it as delivery needs."""

    message_id: str
    receipt_handle: str
    body: str
    attributes: Mapping[str, str]  # message attributes (String values)

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> Message:
        attrs = {
            name: str(value.get("stringValue", ""))
            for name, value in (record.get("messageAttributes") or {}).items()
        }
        return cls(record["messageId"], record["receiptHandle"], record["body"], attrs)


@dataclass(frozen=True)
class Outcome:
    """What to do with a message: delete it (``retry_in_s`` None) or let it come back."""

    verdict: str  # delivered | retry | deferred | failed | duplicate | invalid
    retry_in_s: int | None = None
    reason: str | None = None


@dataclass
class DeliveryDeps:
    records: DeliveryRecords
    slots: Slots | None
    secrets: Callable[[str], list[str]]  # tenant -> the secrets that sign now
    post: Callable[[str, bytes, Mapping[str, str]], Attempt]
    dead_letter: Callable[[Message, str], None]  # (message, reason) -> on the DLQ
    clock: Callable[[], int]  # epoch ms
    jitter: Callable[[], float] = random.random
    retry_for_ms: int = RETRY_FOR_MS


@dataclass
class BatchReport:
    outcomes: dict[str, Outcome] = field(default_factory=dict)

    def count(self, verdict_: str) -> int:
        return sum(1 for o in self.outcomes.values() if o.verdict == verdict_)


def parse_claim(text: str) -> EntryRef | None:
    key, _, name = text.partition(" ")
    return (key, name) if key and name else None


def deliver(message: Message, deps: DeliveryDeps) -> Outcome:
    attrs = message.attributes
    ref = parse_claim(attrs.get("claim", ""))
    try:
        target = Webhook.from_json(attrs["target"])
        tenant, fire = attrs["tenant"], attrs["fire_id"]
    except (KeyError, ValueError, TypeError):
        target = None
    if ref is None or target is None:
        reason = "invalid_message"
        deps.dead_letter(message, reason)
        return Outcome("invalid", reason=reason)
    before = deps.records.read_delivery(ref)
    if before is not None and before.settled:
        return Outcome("duplicate")  # delivered or failed already: SQS handed it out twice
    state = before or DeliveryState()
    now = deps.clock()
    slot = deps.slots.acquire(target.origin, now) if deps.slots is not None else None
    if deps.slots is not None and slot is None:
        low, high = DEFER_S
        return Outcome("deferred", retry_in_s=low + int((high - low) * deps.jitter()))
    try:
        attempt = _attempt(message, target, tenant, fire, deps)
    finally:
        if slot is not None and deps.slots is not None:
            try:
                deps.slots.release(slot)
            except Exception:  # the window ends it anyway
                log.warning("slot release failed", exc_info=True)
    now = deps.clock()
    after = state.after(attempt, now)
    result = verdict(attempt)
    outcome: Outcome
    if result == "delivered":
        after = _with(after, delivered_ms=now)
        outcome = Outcome("delivered")
    elif result == "retry" and not gives_up(after.first_ms or now, now, deps.retry_for_ms):
        wait = retry_wait_s(after.attempts, deps.jitter(), attempt.retry_after_s)
        outcome = Outcome("retry", retry_in_s=max(1, round(wait)), reason=attempt.label)
    else:
        reason = attempt.label
        if result == "retry":
            reason = f"gave up after {after.attempts} attempts: {attempt.label}"
        after = _with(after, failed=reason)
        outcome = Outcome("failed", reason=reason)
    if not deps.records.write_delivery(ref, after, before):
        # Another copy of this message counted an attempt meanwhile: its record stands, and
        # this outcome still holds for this copy (SQS's at-least-once; the consumer dedupes
        # on webhook-id).
        log.warning("delivery record changed meanwhile", extra={"fire_id": fire})
    if outcome.verdict == "failed":
        deps.dead_letter(message, outcome.reason or "failed")
    return outcome


def _with(state: DeliveryState, **changes: Any) -> DeliveryState:
    return DeliveryState(**{**vars(state), **changes})


def _attempt(
    message: Message, target: Webhook, tenant: str, fire: str, deps: DeliveryDeps
) -> Attempt:
    secrets = deps.secrets(tenant)
    if not secrets:
        return Attempt(error="no_signing_secret")
    body = message.body.encode()
    headers = {name: value for name, value in target.headers}
    headers.update(signed_headers(secrets, fire, deps.clock() // 1000, body))
    return deps.post(target.url, body, headers)


def deliver_batch(messages: Sequence[Message], deps: DeliveryDeps) -> BatchReport:
    """Every message of a batch at once: one slow target holds up only its own messages."""
    report = BatchReport()
    if not messages:
        return report

    def one(message: Message) -> tuple[str, Outcome]:
        try:
            return message.message_id, deliver(message, deps)
        except Exception:  # left on the queue: it comes back after its visibility timeout
            log.exception("delivery failed", extra={"message_id": message.message_id})
            return message.message_id, Outcome("error")

    with ThreadPoolExecutor(min(BATCH_WORKERS, len(messages))) as pool:
        report.outcomes = dict(pool.map(one, messages))
    return report


def dead_letter_body(message: Message, reason: str) -> dict[str, Any]:
    """The DLQ copy: the callback body unchanged, with the reason as an attribute."""
    attrs = {
        name: {"DataType": "String", "StringValue": value}
        for name, value in message.attributes.items()
        if value
    }
    attrs["reason"] = {"DataType": "String", "StringValue": reason[:1_000]}
    return {"MessageBody": message.body, "MessageAttributes": attrs}


def summary(report: BatchReport) -> dict[str, int]:
    verdicts = ("delivered", "retry", "deferred", "failed", "duplicate", "invalid", "error")
    return {v: report.count(v) for v in verdicts if report.count(v)}

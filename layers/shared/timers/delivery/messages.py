"""The delivery queue's messages: what one carries, what becomes of it (an Outcome, a
batch's report), and the copies sent on: back to the queue later (deferred), or to the
dead-letter queue with the reason. The delivery function's work is timers.delivery.decisions
(one message) and timers.delivery.batches (a batch)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from timers.core.numbers import ascii_int
from timers.engine.entries import EntryRef

DEFER_FIRST_S = 2
DEFER_MAX_S = 300
"""A message deferred for the caps comes back after 1-2 s, then twice as long each time it is
deferred again (equal jitter), at most 5 minutes: a tenant's backlog behind a slow origin
costs few receives while it waits, instead of cycling every few seconds through the delivery
function every tenant shares."""
DEFERRALS = "deferrals"  # the message attribute counting them

DEAD_LETTERED = "dead_lettered"
"""The reason of a fire whose message SQS moved off the delivery queue (maxReceiveCount)."""


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

    verdict: str  # delivered | retry | deferred | failed | duplicate | invalid | dead_lettered
    retry_in_s: int | None = None
    reason: str | None = None
    recorded: bool = False  # this copy's delivery record won: its verdict is the fire's (usage)


@dataclass
class BatchReport:
    outcomes: dict[str, Outcome] = field(default_factory=dict)

    def count(self, verdict_: str) -> int:
        return sum(1 for o in self.outcomes.values() if o.verdict == verdict_)


def parse_claim(text: str) -> EntryRef | None:
    key, _, name = text.partition(" ")
    return (key, name) if key and name else None


def defer_wait_s(deferrals: int, jitter: float) -> int:
    """Seconds until a message deferred ``deferrals`` times before comes back (>= 1)."""
    ceiling = min(DEFER_MAX_S, DEFER_FIRST_S * 2 ** min(deferrals, 20))
    return max(1, round(ceiling / 2 + ceiling / 2 * jitter))


def deferrals(message: Message) -> int:
    return ascii_int(message.attributes.get(DEFERRALS, "")) or 0


def _attributes(message: Message, **extra: str) -> dict[str, Any]:
    values = {**message.attributes, **extra}
    return {
        name: {"DataType": "String", "StringValue": value}
        for name, value in values.items()
        if value
    }


def dead_letter_body(message: Message, reason: str) -> dict[str, Any]:
    """The DLQ copy: the callback body unchanged, with the reason as an attribute."""
    return {
        "MessageBody": message.body,
        "MessageAttributes": _attributes(message, reason=reason[:1_000]),
    }


def requeue_body(message: Message, delay_s: int) -> dict[str, Any]:
    """A deferred message sent again: unchanged but for its deferral count, back in ``delay_s``
    (SQS's DelaySeconds: at most 15 minutes)."""
    count = str(deferrals(message) + 1)
    return {
        "MessageBody": message.body,
        "MessageAttributes": _attributes(message, **{DEFERRALS: count}),
        "DelaySeconds": min(delay_s, 900),
    }


VERDICTS = ("delivered", "retry", "deferred", "failed", "duplicate", "invalid", "dead_lettered",
            "error")  # fmt: skip
"""Every verdict an Outcome can carry: the delivery function's metrics, one per verdict."""


def summary(report: BatchReport) -> dict[str, int]:
    return {v: report.count(v) for v in VERDICTS if report.count(v)}

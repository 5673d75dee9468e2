"""Failed fires: the pure rules of the record each failed HTTP fire leaves, and of its view.

A fire whose delivery ends ``failed`` (at once, its retry budget spent, no slot for 24 h, or
dead-lettered) is recorded in the tenant's time-ordered list of failures with the message that
failed, so it can be listed and redelivered exactly as it was (the same ``webhook-id``). No I/O
here: timers.delivery.failed_fires stores them, timers.api.failures lists and redelivers them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from timers.core.numbers import ascii_int
from timers.core.timer import fire_due_ms
from timers.core.times import format_ms

KEY_DIGITS = 13
"""Epoch ms fit 13 digits until the year 2286: zero-padded, the sort key orders by time."""
KEY_MAX_MS = 10**KEY_DIGITS - 1

REDELIVERED = "redelivered"
"""The message attribute of a redelivered message: when it was redelivered (epoch ms). The
delivery function reopens a record that failed before then (the redelivery's own write may
not have happened yet: see timers.api.failures)."""
DROPPED_ON_REDELIVERY = frozenset({"deferrals", "reason", REDELIVERED})
"""Attributes a redelivered message does not carry over: it starts with no deferral."""


def sort_key(failed_ms: int, fire_id: str) -> str:
    """The record's range key: time first, then the fire (two fires can fail in one ms)."""
    return f"{failed_ms:0{KEY_DIGITS}d}#{fire_id}"


def key_range(since_ms: int | None, until_ms: int | None) -> tuple[str, str]:
    """The sort keys of failures from ``since_ms`` to ``until_ms``, both included. ``$`` sorts
    right after ``#``, so the upper bound takes every fire of its last millisecond."""
    low = min(max(since_ms or 0, 0), KEY_MAX_MS)
    high = min(max(until_ms if until_ms is not None else KEY_MAX_MS, 0), KEY_MAX_MS)
    return f"{low:0{KEY_DIGITS}d}", f"{high:0{KEY_DIGITS}d}$"


@dataclass(frozen=True)
class FailedFire:
    """One failure of one fire, with the delivery message that failed (body and attributes as
    the delivery queue had them)."""

    tenant: str
    fire_id: str
    timer_id: str
    reason: str
    last_status: int | None
    attempts: int
    failed_ms: int
    body: str
    attributes: Mapping[str, str] = field(default_factory=dict)
    redelivered_ms: int | None = None

    @property
    def at(self) -> str:
        return sort_key(self.failed_ms, self.fire_id)

    def redelivery_attributes(self, redelivered_ms: int) -> dict[str, str]:
        """The attributes of its message sent again: as it failed, without a deferral count,
        stamped with the redelivery (which lets the delivery function reopen the record)."""
        kept = {k: v for k, v in self.attributes.items() if k not in DROPPED_ON_REDELIVERY}
        return {**kept, REDELIVERED: str(redelivered_ms)}


def redelivered_at(attributes: Mapping[str, str]) -> int | None:
    """When a message was redelivered (its ``redelivered`` attribute), None if never."""
    return ascii_int(attributes.get(REDELIVERED, ""))


def failed_fire_view(record: FailedFire, name: str | None) -> dict[str, Any]:
    """A failed fire as the API shows it; ``name`` is its timer's (None: unnamed or gone)."""
    due = fire_due_ms(record.fire_id)
    return {
        "fire_id": record.fire_id,
        "timer_id": record.timer_id,
        "name": name,
        "due_at": None if due is None else format_ms(due),
        "failed_at": format_ms(record.failed_ms),
        "reason": record.reason,
        "last_status": record.last_status,
        "attempts": record.attempts,
        "redelivered_at": None
        if record.redelivered_ms is None
        else format_ms(record.redelivered_ms),
    }

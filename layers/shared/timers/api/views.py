"""The contract's JSON representations of timers and fires."""

from __future__ import annotations

import json
from typing import Any

from timers.core.schedule import schedule_to_dict
from timers.core.timer import Timer, fire_id
from timers.core.times import format_ms
from timers.core.webhook_attempts import DeliveryState
from timers.engine.entries import Entry

STATUS_OF: dict[str, str] = {"p": "pending", "d": "enqueued", "f": "failed"}


def _time(ms: int | None) -> str | None:
    return None if ms is None else format_ms(ms)


def timer_view(timer: Timer) -> dict[str, Any]:
    """A timer as a user sees it (give it the derived timer: timers.engine.entries.resolved)."""
    return {
        "id": timer.id,
        "name": timer.name,
        "schedule": schedule_to_dict(timer.schedule),
        "start_at": _time(timer.start_ms),
        "end_at": _time(timer.end_ms),
        "max_fires": timer.max_fires,
        "target": timer.webhook.shown()  # header values masked: they are the user's secrets
        if timer.webhook
        else {"queue_url": timer.target_queue_url},
        "payload": json.loads(timer.payload_json),
        "misfire": timer.misfire,
        "retry": timer.retry.to_dict() if timer.retry else None,
        "window_seconds": seconds_of(timer.window_ms),
        "group": timer.group,
        "status": timer.status,
        "next_fire_at": _time(timer.next_fire_ms),
        "fire_count": timer.fire_count,
        "created_at": _time(timer.created_ms),
        "updated_at": _time(timer.updated_ms),
        "expires_at": _time(timer.expires_ms) if timer.status == "completed" else None,
    }


def seconds_of(ms: int) -> int | float:
    """Whole seconds as an int (60, not 60.0), else a float."""
    return ms // 1000 if ms % 1000 == 0 else ms / 1000


def fire_view(
    timer_id: str, pos: int, entry: Entry, delivery: DeliveryState | None = None
) -> dict[str, Any]:
    """One fire from its claim entry at chain position ``pos`` and, for an HTTP target, its
    delivery record: ``enqueued`` means on the delivery queue, ``delivered`` that a POST got a
    2xx (``delivered_at``; after a redelivery too), ``failed`` that the POSTs gave up
    (``reason`` says why, with the last status)."""
    scheduled = entry.fired if entry.fired is not None else pos
    enqueued = entry.enqueued if entry.state == "d" else None
    status, reason = STATUS_OF[entry.state], entry.reason
    http = entry.hook or delivery is not None
    if delivery is not None and delivery.failed is not None:
        status, reason = "failed", delivery.failed
    elif delivery is not None and delivery.delivered_ms is not None:
        status = "delivered"
    return {
        "fire_id": fire_id(timer_id, scheduled),
        "scheduled_at": format_ms(scheduled),
        "enqueued_at": _time(enqueued),
        "lag_ms": None if enqueued is None else enqueued - scheduled,
        "status": status,
        "reason": reason,  # why a fire failed; null otherwise
        # HTTP targets only (null for a queue target)
        "delivered_at": _time(delivery.delivered_ms) if delivery else None,
        "attempts": (delivery.attempts if delivery else 0) if http else None,
        "last_status": delivery.last_status if delivery else None,
        "last_error": delivery.last_attempt() if delivery else None,
    }

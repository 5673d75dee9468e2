"""The contract's JSON representations of timers and fires."""

from __future__ import annotations

import json
from typing import Any

from timers.core.schedule import schedule_to_dict
from timers.core.timer import Timer
from timers.core.times import format_ms


def _time(ms: int | None) -> str | None:
    return None if ms is None else format_ms(ms)


def timer_view(timer: Timer) -> dict[str, Any]:
    return {
        "id": timer.id,
        "name": timer.name,
        "schedule": schedule_to_dict(timer.schedule),
        "start_at": _time(timer.start_ms),
        "end_at": _time(timer.end_ms),
        "max_fires": timer.max_fires,
        "target": {"queue_url": timer.target_queue_url},
        "payload": json.loads(timer.payload_json),
        "misfire": timer.misfire,
        "status": timer.status,
        "next_fire_at": _time(timer.next_fire_ms),
        "fire_count": timer.fire_count,
        "created_at": _time(timer.created_ms),
        "updated_at": _time(timer.updated_ms),
    }


def fire_view(
    fire_id: str,
    scheduled_ms: int,
    status: str,
    enqueued_ms: int | None,
    lag_ms: int | None,
    reason: str | None = None,
) -> dict[str, Any]:
    return {
        "fire_id": fire_id,
        "scheduled_at": format_ms(scheduled_ms),
        "enqueued_at": _time(enqueued_ms),
        "lag_ms": lag_ms,
        "status": status,
        "reason": reason,  # why a fire failed; null otherwise
    }

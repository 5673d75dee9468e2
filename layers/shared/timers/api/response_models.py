"""Response models of the HTTP API (pydantic; they shape the OpenAPI document with
timers.api.request_models): what the API answers, exactly.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from timers.api.request_models import MisfireIn

# ---------------------------------------------------------------- responses
# What the API answers, exactly: every field is always present (null where the contract says
# so) and no other field appears, so the document says "required" and "no additional
# properties" and the fuzz test (tests/e2e/test_fuzz.py) holds every answer to it.


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_serialization_defaults_required=True)


Timestamp = Annotated[
    str,
    Field(
        json_schema_extra={"format": "date-time"},
        description="RFC 3339, UTC, milliseconds",
        examples=["2026-11-21T10:00:00.000Z"],
    ),
]
TimerStatus = Literal["active", "paused", "completed"]
FireStatus = Literal["enqueued", "delivered", "pending", "failed"]


class AtOut(_Out):
    type: Literal["at"]
    at: Timestamp


class AfterOut(_Out):
    type: Literal["after"]
    seconds: float


class CronOut(_Out):
    type: Literal["cron"]
    expression: str
    timezone: str


class EveryOut(_Out):
    type: Literal["every"]
    seconds: float


ScheduleOut = Annotated[AtOut | AfterOut | CronOut | EveryOut, Field(discriminator="type")]


class QueueTargetOut(_Out):
    queue_url: str


class HttpTargetOut(_Out):
    url: str
    headers: dict[str, str] = Field(description="Header names; every value shown as ********")


TargetOut = QueueTargetOut | HttpTargetOut


class RetryOut(_Out):
    max_attempts: int | None = Field(description="null: no cap")
    max_age_seconds: int | None = Field(
        description="null: the default, 86400 s from the first attempt"
    )


class TimerOut(_Out):
    id: str
    name: str | None
    schedule: ScheduleOut
    start_at: Timestamp | None
    end_at: Timestamp | None
    max_fires: int | None
    target: TargetOut
    payload: JsonValue
    misfire: MisfireIn
    retry: RetryOut | None = Field(description="The retry policy as given; null: the default")
    window_seconds: float = Field(
        description="The flexible window: each fire lands in [due, due + window_seconds]; "
        "0: on the dot"
    )
    group: str | None = Field(description="The group it is in; null: none")
    status: TimerStatus
    next_fire_at: Timestamp | None
    fire_count: int
    created_at: Timestamp
    updated_at: Timestamp
    expires_at: Timestamp | None = Field(
        None, description="A completed timer is deleted then, with its fire history"
    )


class TimerList(_Out):
    items: list[TimerOut]
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page; null: last")


class TimerBatchOut(_Out):
    items: list[TimerOut] = Field(description="The created timers, in the order of the request")


class GroupOut(_Out):
    name: str
    created_at: Timestamp = Field(
        description="When the group was first seen: its first timer joined (a group emptied "
        "and joined again may keep its first time until a listing found it empty)"
    )


class GroupList(_Out):
    items: list[GroupOut] = Field(description="The tenant's groups that have a timer, by name")
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page; null: last")


class GroupChangeOut(_Out):
    group: str
    action: Literal["pause", "resume", "delete"]
    changed: int = Field(
        description="Timers this call changed (at most 500); one already in the asked state "
        "is not counted"
    )
    done: bool = Field(
        description="true: every timer of the group has been through the operation; false: "
        "call again (the next call goes on where this one stopped)"
    )


class LastAttemptOut(_Out):
    status: int | None = Field(description="The answer's HTTP status; null: no answer")
    error: (
        Literal[
            "timeout", "connection_error", "blocked_address", "invalid_target", "no_signing_secret"
        ]
        | None
    ) = Field(
        description="Why there was no answer (no_signing_secret: the tenant had no webhook "
        "secret, so nothing was sent); null when there was one"
    )
    body: str = Field(description="The answer's first 512 bytes, as text")
    latency_ms: int = Field(description="From the start of the POST to its answer or error")


class FireOut(_Out):
    fire_id: str = Field(description="<timer id>:<due epoch ms>")
    scheduled_at: Timestamp
    enqueued_at: Timestamp | None
    lag_ms: int | None
    status: FireStatus = Field(
        description="enqueued = on the target queue (a queue target: that is its delivery) or, "
        "for an HTTP target, on the delivery queue; delivered = an HTTP target's POST got a "
        "2xx (delivered_at), after a redelivery too; failed = the POSTs gave up (reason, with "
        "the last status)"
    )
    reason: str | None = Field(None, description="Why a fire failed; null otherwise")
    delivered_at: Timestamp | None = Field(
        None, description="HTTP targets: when a POST got a 2xx; null otherwise"
    )
    attempts: int | None = Field(None, description="HTTP targets: POSTs made; null for queues")
    last_status: int | None = Field(
        None, description="HTTP targets: the last answer's HTTP status; null: none yet or no answer"
    )
    last_error: LastAttemptOut | None = Field(
        None,
        description="HTTP targets: how the last POST went (null before one, and for queues); "
        "the request's headers are never kept",
    )


class FireList(_Out):
    items: list[FireOut]
    next_cursor: str | None


class FailedFireOut(_Out):
    fire_id: str = Field(description="<timer id>:<due epoch ms>; the webhook-id of its POSTs")
    timer_id: str
    name: str | None = Field(description="The timer's name; null: none, or the timer is gone")
    due_at: Timestamp
    failed_at: Timestamp
    reason: str = Field(
        description="Why delivery ended: e.g. http 400, blocked_address, invalid_target, "
        "dead_lettered, gave up after 41 attempts: http 503, gave up after 0 attempts: "
        "concurrency_cap"
    )
    last_status: int | None = Field(description="The last answer's HTTP status; null: none")
    attempts: int = Field(description="POSTs made when it failed")
    redelivered_at: Timestamp | None = Field(
        description="When it was redelivered; null: not yet. A redelivered failure is left out "
        "of the list unless include_redelivered is true; a fire that fails again after a "
        "redelivery is listed again, as a new failure"
    )


class FailedFireList(_Out):
    items: list[FailedFireOut]
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page; null: last")


class FailedFireBatchOut(_Out):
    items: list[FailedFireOut] = Field(description="The fires redelivered, newest first")


class PreviewOut(_Out):
    fire_times: list[Timestamp]


class TenantOut(_Out):
    tenant: str
    callback_queue_url: str
    retention_days: int = Field(description="How long completed timers and fires stay readable")
    webhook_secret: str | None = Field(
        description="whsec_...: signs the tenant's HTTP callbacks (Standard Webhooks)"
    )


class KeyOut(_Out):
    key_id: str = Field(
        description="Names the key: its first 10 characters (and a part of its hash if another "
        "key of the tenant starts the same); not a secret"
    )
    created_at: Timestamp
    last_used_at: Timestamp | None = Field(
        description="When a request last used it (to about a minute); null: never"
    )
    label: str | None


class KeyCreatedOut(KeyOut):
    api_key: str = Field(description="The secret: shown in this answer only, stored hashed")


class KeyList(_Out):
    items: list[KeyOut] = Field(
        description="The tenant's keys, oldest first: at most 10 (and a key from before "
        "tenants had a key list, which joins it on its first use even past 10)"
    )


class FireCountsOut(_Out):
    enqueued: int = Field(description="Fires put on their queue (or the delivery queue)")
    delivered: int = Field(description="HTTP fires a POST delivered (2xx)")
    failed: int = Field(description="Fires that failed: a queue refused, or delivery gave up")
    late_1s: int = Field(description="Fires enqueued more than 1 s after their due time")


class LagCountsOut(_Out):
    """The month's enqueued fires by lateness L (ms): enqueue time minus due time."""

    ontime: int = Field(description="L = 0: enqueued at the due time")
    ms_1_200: int = Field(alias="1-200ms", description="1 <= L <= 200")
    ms_200_600: int = Field(alias="200-600ms", description="200 < L <= 600")
    ms_600_1000: int = Field(alias="600-1000ms", description="600 < L <= 1000")
    ms_1000_2000: int = Field(alias="1000-2000ms", description="1000 < L <= 2000")
    over_2000ms: int = Field(description="L > 2000")


class UsageOut(_Out):
    month: str = Field(description="YYYY-MM (UTC)", examples=["2026-11"])
    fires: FireCountsOut
    lag: LagCountsOut = Field(
        description="The enqueued fires by accuracy level; the six add up to fires.enqueued"
    )
    timers_created: int
    active_timers: int = Field(
        description="Timers active at the end of the month (UTC): an earlier month answers the "
        "count at its end, this month the count now"
    )


class HealthOut(_Out):
    status: Literal["ok"]


class ErrorDetail(_Out):
    field: str = Field(description="Dotted path of the offending input (schedule.expression)")
    message: str


class ErrorBody(_Out):
    code: str = Field(
        description="validation_error, unauthorized, not_found, method_not_allowed, "
        "idempotency_conflict, invalid_state, concurrent_update, payload_too_large, "
        "unsupported_media_type, rate_limited, unavailable"
    )
    message: str
    details: list[ErrorDetail]


class ErrorOut(_Out):
    error: ErrorBody

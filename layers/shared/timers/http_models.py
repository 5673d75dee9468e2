"""Request and response models of the HTTP API (pydantic): they shape the OpenAPI document.

Models check types and ranges and forbid unknown fields; meaning (cron syntax, time zones,
``at`` not too old, end after start) is checked by the core so there is one rule for each.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, JsonValue, StrictInt

from timers.core import schedule as sched
from timers.core.errors import FieldError, InvalidInput
from timers.core.groups import check_group
from timers.core.schedule import Plan
from timers.core.timer import serialize_payload
from timers.core.times import parse_ms
from timers.core.webhooks import STORED_HEADERS, RetryPolicy, masked_headers
from timers.service import TimerSpec


def _rfc3339(value: str) -> str:
    parse_ms(value)  # raises ValueError with the expected format
    return value


Rfc3339 = Annotated[
    str,
    AfterValidator(_rfc3339),
    Field(
        max_length=64, json_schema_extra={"format": "date-time"}, examples=["2026-11-21T10:00:00Z"]
    ),
]
Number = float  # strict: JSON numbers only, ints accepted


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class AtIn(_Strict):
    type: Literal["at"]
    at: Rfc3339 = Field(description="When to fire; at most 5 minutes in the past")


class AfterIn(_Strict):
    type: Literal["after"]
    seconds: Annotated[Number, Field(ge=0, description="Seconds after the request; fractional ok")]


class CronIn(_Strict):
    type: Literal["cron"]
    # As long as EventBridge Scheduler allows: every fire re-parses it.
    expression: str = Field(
        max_length=256, description="5-field cron: minute hour day-of-month month day-of-week"
    )
    timezone: str = Field(
        "UTC", max_length=64, description="IANA time zone; DST follows Debian cron"
    )


class EveryIn(_Strict):
    type: Literal["every"]
    seconds: Annotated[Number, Field(ge=1, description="Period in seconds")]


ScheduleIn = Annotated[AtIn | AfterIn | CronIn | EveryIn, Field(discriminator="type")]
MisfireIn = Literal["fire_once", "fire_all", "skip"]
WindowIn = Annotated[
    Number,
    Field(
        ge=0,
        le=900,
        description="The flexible window in seconds (0..900, fractional ok): each fire lands "
        "at a moment of the service's choosing in [due, due + window] - never before its due "
        "time - so fires meet and cost less. 0: on the dot. Fire ids and `scheduled_at` stay "
        "the due time; `lag_ms` counts from it",
    ),
]


GroupIn = Annotated[
    str,
    Field(
        description="The group the timer is in: 1-64 characters of A-Z a-z 0-9 . _ - "
        "(null: in no group). A group's timers are paused, resumed or deleted together "
        "(/v1/groups/{name}/...); another tenant's group of the same name is another group",
        examples=["order-1234"],
        json_schema_extra={"pattern": "^[A-Za-z0-9._-]{1,64}$", "maxLength": 64, "minLength": 1},
    ),
]


class TargetIn(_Strict):
    """A queue (``queue_url``) or an HTTP endpoint (``url`` and optional ``headers``)."""

    queue_url: str | None = Field(
        None, max_length=1024, description="Default: the tenant's callback queue"
    )
    url: str | None = Field(
        None,
        description="HTTP target: an https:// URL (no credentials, <= 2,048 characters); "
        "the fire is POSTed there, signed per Standard Webhooks",
    )
    headers: dict[str, str] | None = Field(
        None,
        description="HTTP target: up to 10 extra request headers (not webhook-*, host, "
        "content-length, transfer-encoding or connection; content-type is always "
        "application/json). Answers show their names with the values masked (********). "
        "A PATCH without headers keeps the timer's, and a header given as ******** keeps its "
        "value - both only while the URL's origin stays the same",
    )


class RetryIn(_Strict):
    """How long an HTTP fire is retried (both optional; a queue target's timer keeps it
    too, unused). Either bound counts from the fire's due time; reached, the fire ends
    `failed` with no further POST."""

    max_attempts: Annotated[StrictInt, Field(ge=1, le=100)] | None = Field(
        None, description="POSTs at most (1..100); default: no cap"
    )
    max_age_seconds: Annotated[StrictInt, Field(ge=60, le=86_400)] | None = Field(
        None,
        description="Seconds after the due time (60..86400); default: 86400 from the first attempt",
    )


class TimerCreate(_Strict):
    name: Annotated[str, Field(max_length=256)] | None = None
    schedule: ScheduleIn
    start_at: Rfc3339 | None = None
    end_at: Rfc3339 | None = None
    max_fires: Annotated[StrictInt, Field(ge=1)] | None = None
    target: TargetIn | None = None
    payload: JsonValue = Field(None, description="Any JSON value, <= 64 KiB serialized")
    misfire: MisfireIn = "fire_once"
    retry: RetryIn | None = None
    window_seconds: WindowIn = 0
    group: GroupIn | None = None


class TimerBatchIn(_Strict):
    timers: Annotated[list[TimerCreate], Field(min_length=1, max_length=100)]


def _absent(schema: dict[str, Any]) -> None:
    schema.pop("default", None)  # an absent field is left as it is, not set to a default


# Optional but never null: a PATCH without it keeps the timer's value; null is a 400.
_KEEP: Any = Field(None, json_schema_extra=_absent)


class TimerPatch(_Strict):
    """Only the fields present are changed; ``null`` clears an optional field (``name``,
    ``start_at``, ``end_at``, ``max_fires``, ``target``, ``payload``, ``retry``; ``group``: out
    of its group); ``schedule``,
    ``misfire`` and ``window_seconds`` (0: none) cannot be null."""

    name: Annotated[str, Field(max_length=256)] | None = None
    schedule: ScheduleIn = _KEEP
    start_at: Rfc3339 | None = None
    end_at: Rfc3339 | None = None
    max_fires: Annotated[StrictInt, Field(ge=1)] | None = None
    target: TargetIn | None = None
    payload: JsonValue = None
    misfire: MisfireIn = _KEEP
    retry: RetryIn | None = None
    window_seconds: WindowIn = _KEEP
    group: GroupIn | None = None


class PreviewIn(_Strict):
    schedule: ScheduleIn
    start_at: Rfc3339 | None = None
    end_at: Rfc3339 | None = None
    max_fires: Annotated[StrictInt, Field(ge=1)] | None = None
    count: Annotated[StrictInt, Field(ge=1, le=100)] = 10


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


class KeyCreate(_Strict):
    label: Annotated[str, Field(max_length=128)] | None = Field(
        None, description="What the key is for (shown in the list); <= 128 characters"
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


# ---------------------------------------------------------------- to the core


def _schedule(data: BaseModel) -> sched.Schedule:
    try:
        return sched.schedule_from_dict(data.model_dump())
    except sched.ScheduleError as exc:
        raise InvalidInput("invalid schedule", exc.errors) from None


def _ms(value: str | None) -> int | None:
    return None if value is None else parse_ms(value)


def to_spec(body: TimerCreate, payload_json: str) -> TimerSpec:
    if body.target and (masked := masked_headers(body.target.headers)):
        raise InvalidInput("invalid HTTP target", masked)
    return TimerSpec(
        schedule=_schedule(body.schedule),
        payload_json=payload_json,
        name=body.name,
        start_ms=_ms(body.start_at),
        end_ms=_ms(body.end_at),
        max_fires=body.max_fires,
        target_queue_url=body.target.queue_url if body.target else None,
        target_url=body.target.url if body.target else None,
        target_headers=body.target.headers if body.target else None,
        misfire=body.misfire,
        retry=_retry(body.retry),
        window_ms=window_ms(body.window_seconds),
        group=_group(body.group),
    )


def _group(value: str | None, field: str = "group") -> str | None:
    check_group(value, field)  # one rule, the core's: named here as the request names it
    return value


def window_ms(seconds: float) -> int:
    return round(seconds * 1000)


def to_specs(body: TimerBatchIn) -> list[TimerSpec]:
    """A batch's timers; every invalid schedule is reported at once, named ``timers[i].*``
    (as the service names its own checks), so a client can tell which timers to fix."""
    specs: list[TimerSpec] = []
    errors: list[FieldError] = []
    for i, timer in enumerate(body.timers):
        payload = serialize_payload(timer.payload, f"timers[{i}].payload")
        try:
            specs.append(to_spec(timer, payload))
        except InvalidInput as exc:
            errors += [FieldError(f"timers[{i}].{e.field}", e.message) for e in exc.details]
    if errors:
        raise InvalidInput("some timers of the batch are invalid; none was created", errors)
    return specs


def _retry(body: RetryIn | None) -> RetryPolicy | None:
    return None if body is None else RetryPolicy(body.max_attempts, body.max_age_seconds)


_PATCH_FIELDS = {"start_at": "start_ms", "end_at": "end_ms"}


def to_changes(body: TimerPatch, payload_json: str | None) -> dict[str, Any]:
    """The Timer fields a PATCH sets (only those present in the request)."""
    changes: dict[str, Any] = {}
    for name in body.model_fields_set:
        value = getattr(body, name)
        if name == "schedule":
            changes["schedule"] = _schedule(value)
        elif name in _PATCH_FIELDS:
            changes[_PATCH_FIELDS[name]] = _ms(value)
        elif name == "target":
            changes["target"] = value.model_dump() if value else None
            if value is not None and value.url is not None:
                changes[STORED_HEADERS] = "headers" not in value.model_fields_set
        elif name == "payload":
            changes["payload_json"] = payload_json
        elif name == "retry":
            changes["retry"] = _retry(value)
        elif name == "window_seconds":
            changes["window_ms"] = window_ms(value)
        elif name == "group":
            changes["group"] = _group(value)
        else:
            changes[name] = value
    return changes


def to_plan(body: PreviewIn, now_ms: int) -> Plan:
    plan = Plan(
        _schedule(body.schedule), now_ms, _ms(body.start_at), _ms(body.end_at), body.max_fires
    )
    errors = sched.validate_plan(plan, now_ms)
    if errors:
        raise InvalidInput("the schedule is invalid", errors)
    return plan

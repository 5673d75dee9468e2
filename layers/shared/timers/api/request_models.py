"""Request models of the HTTP API (pydantic; they shape the OpenAPI document with
timers.api.response_models), and what a request becomes for the core.

Models check types and ranges and forbid unknown fields; meaning (cron syntax, time zones,
``at`` not too old, end after start) is checked by the core so there is one rule for each.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, JsonValue, StrictInt

from timers.api.creating import TimerSpec
from timers.core import schedule as sched
from timers.core.errors import FieldError, InvalidInput
from timers.core.groups import check_group
from timers.core.schedule import Plan
from timers.core.timer import serialize_payload
from timers.core.times import parse_ms
from timers.core.webhooks import STORED_HEADERS, RetryPolicy, masked_headers


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


class KeyCreate(_Strict):
    label: Annotated[str, Field(max_length=128)] | None = Field(
        None, description="What the key is for (shown in the list); <= 128 characters"
    )


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

"""What the API answers, as typed objects. Field names are the OpenAPI document's (a test
compares them with ``TimerOut``, ``FireOut``, ``TenantOut`` ... so they cannot drift)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Generic, TypeVar

JSON = Any
T = TypeVar("T")


def _build(cls: type[T], data: dict[str, Any]) -> T:
    """``cls`` from an answer's object; fields a newer server adds are ignored."""
    names = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    return cls(**{k: v for k, v in data.items() if k in names})


@dataclass(frozen=True)
class Timer:
    id: str
    name: str | None
    schedule: dict[str, Any]
    start_at: str | None
    end_at: str | None
    max_fires: int | None
    target: dict[str, Any]
    payload: JSON
    misfire: str
    status: str
    next_fire_at: str | None
    fire_count: int
    created_at: str
    updated_at: str
    expires_at: str | None = None
    retry: dict[str, Any] | None = None  # {"max_attempts", "max_age_seconds"}; None: default
    window_seconds: float = 0  # the flexible window: each fire lands in [due, due + window]
    group: str | None = None  # the group it is in; None: none

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Timer:
        return _build(cls, data)


@dataclass(frozen=True)
class Group:
    """One of the tenant's groups (``GET /v1/groups``): it has a timer in it."""

    name: str
    created_at: str

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Group:
        return _build(cls, data)


@dataclass(frozen=True)
class GroupChange:
    """A group operation's answer: ``changed`` timers this call (or, from the SDK's looping
    methods, all calls); ``done`` once every timer of the group went through it."""

    group: str
    action: str
    changed: int
    done: bool

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> GroupChange:
        return _build(cls, data)


@dataclass(frozen=True)
class Fire:
    fire_id: str
    scheduled_at: str
    enqueued_at: str | None
    lag_ms: int | None
    status: str
    reason: str | None = None
    delivered_at: str | None = None  # HTTP targets: when a POST got a 2xx
    attempts: int | None = None  # HTTP targets: POSTs made
    last_status: int | None = None  # HTTP targets: the last answer's status
    last_error: dict[str, Any] | None = None  # HTTP targets: status, error, body, latency_ms

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Fire:
        return _build(cls, data)


@dataclass(frozen=True)
class Key:
    """One of the tenant's API keys; ``api_key`` (the secret) only in ``create_key``'s answer."""

    key_id: str
    created_at: str
    last_used_at: str | None
    label: str | None
    api_key: str | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Key:
        return _build(cls, data)


@dataclass(frozen=True)
class FailedFire:
    """A fire of an HTTP target whose delivery gave up (``GET /v1/fires?status=failed``)."""

    fire_id: str
    timer_id: str
    name: str | None
    due_at: str
    failed_at: str
    reason: str
    last_status: int | None
    attempts: int
    redelivered_at: str | None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FailedFire:
        return _build(cls, data)


@dataclass(frozen=True)
class Page(Generic[T]):
    """One page of a listing; ``next_cursor`` is None on the last."""

    items: list[T]
    next_cursor: str | None


@dataclass(frozen=True)
class Preview:
    fire_times: list[str]


@dataclass(frozen=True)
class Tenant:
    tenant: str
    callback_queue_url: str
    retention_days: int
    webhook_secret: str | None = None  # whsec_...: verify HTTP callbacks with it

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Tenant:
        return _build(cls, data)

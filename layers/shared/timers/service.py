"""Use cases of the HTTP API. Validated input in, contract views out; storage through ports."""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any, Literal, Protocol, TypeVar

from timers.core import timer as timers
from timers.core.errors import (
    ConcurrentUpdate,
    FieldError,
    IdempotencyConflict,
    InvalidInput,
    NotFound,
)
from timers.core.schedule import Misfire, Plan, Schedule, preview
from timers.core.timer import Timer
from timers.core.times import format_ms
from timers.core.views import fire_view, timer_view
from timers.store import FireStore, IdempotencyStore, TimerStore
from timers.tenants import Tenant

log = logging.getLogger(__name__)

Clock = Callable[[], int]
Occurrence = tuple[str, str, int]  # (tenant, timer id, due ms)
T = TypeVar("T")
WRITE_ATTEMPTS = 5


class DueIndex(Protocol):
    """The Redis side of the fast path (timers.redis_index.RedisIndex)."""

    def add(self, items: Iterable[Occurrence]) -> int: ...

    def remove(self, items: Iterable[Occurrence]) -> int: ...


@dataclass(frozen=True)
class TimerSpec:
    """What a POST may set, already type-checked by the api's request models."""

    schedule: Schedule
    payload_json: str = "null"
    name: str | None = None
    start_ms: int | None = None
    end_ms: int | None = None
    max_fires: int | None = None
    target_queue_url: str | None = None
    misfire: Misfire = "fire_once"


@dataclass
class TimerService:
    timers: TimerStore
    fires: FireStore
    idempotency: IdempotencyStore
    clock: Clock
    lookahead_ms: int
    index: DueIndex | None = None

    # ---------------------------------------------------------------- create

    def create(
        self, tenant: Tenant, spec: TimerSpec, idempotency_key: str | None
    ) -> dict[str, Any]:
        now = self.clock()
        target = self._target(tenant, spec.target_queue_url)
        timer = timers.create(
            tenant.name,
            timers.new_timer_id(),
            schedule=spec.schedule,
            target_queue_url=target,
            payload_json=spec.payload_json,
            now_ms=now,
            misfire=spec.misfire,
            name=spec.name,
            start_ms=spec.start_ms,
            end_ms=spec.end_ms,
            max_fires=spec.max_fires,
        )
        if idempotency_key is None:
            return self._view_after_write(None, self.timers.put(timer))
        return self._create_once(tenant, idempotency_key, spec, timer)

    def _create_once(
        self, tenant: Tenant, key: str, spec: TimerSpec, timer: Timer
    ) -> dict[str, Any]:
        body_hash = _fingerprint(spec)
        seen = self.idempotency.claim(tenant.name, key, body_hash, timer.id, timer.created_ms)
        if seen is not None and seen.body_hash != body_hash:
            raise IdempotencyConflict(
                "this Idempotency-Key was already used with a different request body"
            )
        if seen is not None and seen.response is not None:
            return dict(json.loads(seen.response))
        if seen is not None:
            # a first attempt is in flight or died before answering: use the id it recorded,
            # so the conditional create below can only ever make one timer for this key
            timer = replace(timer, id=seen.timer_id)
        try:
            view = self._view_after_write(None, self.timers.put(timer))
        except ConcurrentUpdate:
            existing = self.timers.get(tenant.name, timer.id)
            if existing is None:
                raise
            view = timer_view(existing)
        self.idempotency.complete(tenant.name, key, json.dumps(view))
        return view

    def _target(self, tenant: Tenant, queue_url: str | None) -> str:
        if queue_url is None:
            return tenant.callback_queue_url
        if not tenant.may_target(queue_url):
            raise InvalidInput(
                "target queue is not registered for this tenant",
                [FieldError("target.queue_url", "not the tenant's callback queue nor allowed")],
            )
        return queue_url

    # ---------------------------------------------------------------- read

    def get(self, tenant: Tenant, timer_id: str) -> dict[str, Any]:
        return timer_view(self._load(tenant, timer_id))

    def list(
        self, tenant: Tenant, status: str | None, limit: int, cursor: str | None
    ) -> dict[str, Any]:
        after = _decode_cursor(cursor, tenant, scope=f"timers:{status or '*'}")
        items, last = self.timers.list(tenant.name, status, limit, after)
        return {
            "items": [timer_view(t) for t in items],
            "next_cursor": _encode_cursor(last, tenant, scope=f"timers:{status or '*'}"),
        }

    def fire_history(
        self, tenant: Tenant, timer_id: str, limit: int, cursor: str | None
    ) -> dict[str, Any]:
        self._load(tenant, timer_id)
        scope = f"fires:{timer_id}"
        before = _decode_cursor(cursor, tenant, scope)
        records, last = self.fires.history(
            tenant.name, timer_id, limit, int(before) if before is not None else None
        )
        return {
            "items": [
                fire_view(r.fire_id, r.scheduled_ms, r.status, r.enqueued_ms, r.lag_ms, r.reason)
                for r in records
            ],
            "next_cursor": _encode_cursor(None if last is None else str(last), tenant, scope),
        }

    def preview(self, plan: Plan, count: int) -> dict[str, Any]:
        return {"fire_times": [format_ms(ms) for ms in preview(plan, count)]}

    # ---------------------------------------------------------------- change

    def patch(self, tenant: Tenant, timer_id: str, changes: dict[str, Any]) -> dict[str, Any]:
        if "target_queue_url" in changes:
            changes = {
                **changes,
                "target_queue_url": self._target(tenant, changes["target_queue_url"]),
            }
        return self._update(tenant, timer_id, lambda t, now: timers.patch(t, changes, now))

    def pause(self, tenant: Tenant, timer_id: str) -> dict[str, Any]:
        return self._update(tenant, timer_id, timers.pause)

    def resume(self, tenant: Tenant, timer_id: str) -> dict[str, Any]:
        return self._update(tenant, timer_id, timers.resume)

    def delete(self, tenant: Tenant, timer_id: str) -> None:
        def attempt() -> None:
            timer = self._load(tenant, timer_id)
            self.timers.delete(timer)
            self._unindex(timer)

        _retry_on_conflict(attempt)

    def _update(
        self, tenant: Tenant, timer_id: str, change: Callable[[Timer, int], Timer]
    ) -> dict[str, Any]:
        def attempt() -> dict[str, Any]:
            before = self._load(tenant, timer_id)
            after = change(before, self.clock())
            if after == before:
                return timer_view(before)
            return self._view_after_write(before, self.timers.put(after))

        return _retry_on_conflict(attempt)

    def _load(self, tenant: Tenant, timer_id: str) -> Timer:
        timer = self.timers.get(tenant.name, timer_id)
        if timer is None:
            raise NotFound(f"no timer {timer_id!r}")
        return timer

    # ---------------------------------------------------------------- fast path

    def _view_after_write(self, before: Timer | None, after: Timer) -> dict[str, Any]:
        """Keep Redis in step with a write; DynamoDB stays the truth if Redis is unreachable."""
        if before is not None and _occurrence(before) != _occurrence(after):
            self._sync("remove", before)
        due = _occurrence(after)
        if due is not None and due[2] <= self.clock() + self.lookahead_ms:
            self._sync("add", after)
        return timer_view(after)

    def _unindex(self, timer: Timer) -> None:
        self._sync("remove", timer)

    def _sync(self, action: Literal["add", "remove"], timer: Timer) -> None:
        occurrence = _occurrence(timer)
        if self.index is None or occurrence is None:
            return
        apply = self.index.add if action == "add" else self.index.remove
        try:
            apply([occurrence])
        except Exception:  # the migrator rebuilds Redis from DynamoDB; this only costs latency
            log.warning("fast path %s failed; the migrator will catch up", action, exc_info=True)


def _occurrence(timer: Timer) -> Occurrence | None:
    """The Redis member a timer should have, if any."""
    if not timer.is_due_indexed or timer.next_fire_ms is None:
        return None
    return (timer.tenant, timer.id, timer.next_fire_ms)


def _retry_on_conflict(attempt: Callable[[], T]) -> T:
    """Optimistic concurrency: re-read and re-apply when another writer won (e.g. a fire)."""
    for _ in range(WRITE_ATTEMPTS - 1):
        try:
            return attempt()
        except ConcurrentUpdate:
            continue
    return attempt()


def _fingerprint(spec: TimerSpec) -> str:
    canonical = json.dumps(
        {**spec.__dict__, "schedule": repr(spec.schedule)}, sort_keys=True, default=str
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


# ---------------------------------------------------------------- cursors
# Opaque to clients; bound to the tenant and the listing they came from, so one tenant's
# cursor is rejected for another (even though each query is already scoped to its tenant).


def _encode_cursor(position: str | None, tenant: Tenant, scope: str) -> str | None:
    if position is None:
        return None
    raw = json.dumps({"t": tenant.name, "s": scope, "p": position}, separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def _decode_cursor(cursor: str | None, tenant: Tenant, scope: str) -> str | None:
    if cursor is None:
        return None
    try:
        data = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        valid = data["t"] == tenant.name and data["s"] == scope and isinstance(data["p"], str)
    except (ValueError, KeyError, TypeError, binascii.Error):
        valid = False
    if not valid:
        raise InvalidInput(
            "invalid cursor", [FieldError("cursor", "not a cursor this listing returned")]
        )
    return str(data["p"])

"""Creating timers, the HTTP API's first use case: one or a batch (all or nothing), each
target checked (a queue the tenant may use, or an HTTP target), at most once per
Idempotency-Key - a retry answers what the first request did, and completes its set.
:class:`Creating` is a part of timers.api.service's TimerService.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from timers.api.groups_table import GroupStore
from timers.api.idempotency import IdempotencyRecord, IdempotencyStore
from timers.api.views import timer_view
from timers.core import timer as timers
from timers.core.errors import FieldError, IdempotencyConflict, InvalidInput
from timers.core.schedule import Misfire, Schedule
from timers.core.timer import Timer
from timers.core.webhooks import RetryPolicy, Webhook, validate_target
from timers.engine.changes import Changes
from timers.engine.entries import partition_for, spread_of
from timers.tenancy.table import Tenant
from timers.tenancy.usage import UsageCounters, add_quietly, month_of

BATCH_LIMIT = 100


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
    target_url: str | None = None  # an HTTP target (then target_queue_url is None)
    target_headers: dict[str, str] | None = None
    misfire: Misfire = "fire_once"
    retry: RetryPolicy | None = None
    window_ms: int = 0  # the flexible window
    group: str | None = None  # the group it joins (None: none)


class Creating:
    """TimerService's create and create_batch (the fields it reads are TimerService's)."""

    changes: Changes
    idempotency: IdempotencyStore
    clock: Callable[[], int]
    allow_loopback_targets: bool
    local_stack: bool
    usage: UsageCounters | None
    groups: GroupStore | None

    # ---------------------------------------------------------------- create

    def create(
        self, tenant: Tenant, spec: TimerSpec, idempotency_key: str | None
    ) -> dict[str, Any]:
        return self.create_batch(tenant, [spec], idempotency_key, single=True)[0]

    def create_batch(
        self,
        tenant: Tenant,
        specs: Sequence[TimerSpec],
        idempotency_key: str | None,
        single: bool = False,
    ) -> list[dict[str, Any]]:
        """Create timers, all or nothing: every one is validated first (errors name
        ``timers[i].field``), then the wakeups, the timers, and Redis are written."""
        if not single and not 1 <= len(specs) <= BATCH_LIMIT:
            raise InvalidInput(
                "a batch holds 1 to 100 timers", [FieldError("timers", "1 to 100 items")]
            )
        now = self.clock()
        try:
            built = self._build_all(
                tenant, specs, [timers.new_timer_id() for _ in specs], now, single
            )
        except InvalidInput:
            # A retry may come after its body stopped being valid (an ``at`` now too far in
            # the past): the first answer stands.
            seen = idempotency_key and self.idempotency.read(tenant.name, idempotency_key, now)
            if not seen:
                raise
            return self._replay(tenant, idempotency_key or "", specs, single, seen)
        self._joining(tenant, built)
        if idempotency_key is None:
            self.changes.store_new(built, take_back=True)
            self._created(tenant, built)
            return [timer_view(t) for t in built]
        return self._create_once(tenant, idempotency_key, specs, built, single)

    def _build_all(
        self,
        tenant: Tenant,
        specs: Sequence[TimerSpec],
        ids: Sequence[str],
        now: int,
        single: bool,
    ) -> list[Timer]:
        built: list[Timer] = []
        errors: list[FieldError] = []
        for i, (spec, timer_id) in enumerate(zip(specs, ids, strict=True)):
            try:
                built.append(self._build(tenant, spec, timer_id, now))
            except InvalidInput as exc:
                if single:
                    raise
                errors += [FieldError(f"timers[{i}].{e.field}", e.message) for e in exc.details]
        if errors:
            raise InvalidInput("some timers of the batch are invalid; none was created", errors)
        return built

    def _build(self, tenant: Tenant, spec: TimerSpec, timer_id: str, now: int) -> Timer:
        queue_url, webhook = self._targets(
            tenant, spec.target_queue_url, spec.target_url, spec.target_headers
        )
        timer = timers.create(
            tenant.name,
            timer_id,
            schedule=spec.schedule,
            target_queue_url=queue_url,
            webhook=webhook,
            payload_json=spec.payload_json,
            now_ms=now,
            misfire=spec.misfire,
            name=spec.name,
            start_ms=spec.start_ms,
            end_ms=spec.end_ms,
            max_fires=spec.max_fires,
            retry=spec.retry,
            window_ms=spec.window_ms,
            group=spec.group,
        )
        partition = partition_for(tenant.name, timer_id, spread_of(tenant.spread, timer))
        return self.changes.with_expiry(replace(timer, rev=1, partition=partition), now)

    def _create_once(
        self,
        tenant: Tenant,
        key: str,
        specs: Sequence[TimerSpec],
        built: list[Timer],
        single: bool,
    ) -> list[dict[str, Any]]:
        """The first request with a key records its body's hash, ids and clock, then stores its
        timers; any other with the key answers what the first did (:meth:`_replay`). Nothing is
        taken back on a failure: the key's retry completes the same set."""
        body_hash = _fingerprint(specs, single)
        ids = [t.id for t in built]
        seen = self.idempotency.claim(tenant.name, key, body_hash, ids, built[0].created_ms)
        if seen is not None:
            return self._replay(tenant, key, specs, single, seen)
        self._store_keyed(tenant, key, built)
        self.idempotency.complete(tenant.name, key)
        return [timer_view(t) for t in built]

    def _store_keyed(self, tenant: Tenant, key: str, timers: Sequence[Timer]) -> None:
        """A keyed create's timers, each only where absent; counted in usage as stored, by
        whichever attempt stored it - a request that fails midway counts what it did store."""
        stored: list[Timer] = []
        try:
            self.changes.store_new(timers, False, self.idempotency.guard(tenant.name, key), stored)
        finally:
            self._created(tenant, stored)

    def _joining(self, tenant: Tenant, joining: Sequence[Timer]) -> None:
        """Timers are about to join groups: each group is registered first (as a wake listing
        is written before its timer), so a group with a timer is always listed."""
        names = {t.group for t in joining if t.group is not None}
        if names and self.groups is not None:
            self.groups.touch(tenant.name, names, self.clock())

    def _created(self, tenant: Tenant, built: Sequence[Timer]) -> None:
        if self.usage is None or not built:
            return
        active = sum(t.status == "active" for t in built)
        add_quietly(self.usage, tenant.name, month_of(built[0].created_ms),
                    {"timers_created": len(built), "active": active})  # fmt: skip

    def _replay(
        self,
        tenant: Tenant,
        key: str,
        specs: Sequence[TimerSpec],
        single: bool,
        seen: IdempotencyRecord,
    ) -> list[dict[str, Any]]:
        """The first request's answer, rebuilt from the same body at its ids and clock. If it
        is in flight or died before it answered, its timers are stored here too - one by one,
        only where absent - so a key never makes two sets, and never loses the first's."""
        if seen.body_hash != _fingerprint(specs, single):
            raise IdempotencyConflict(
                "this Idempotency-Key was already used with a different request body"
            )
        first = self._build_all(tenant, specs, seen.timer_ids, seen.created_ms, single)
        if not seen.done:
            self._joining(tenant, first)
            self._store_keyed(tenant, key, first)
            self.idempotency.complete(tenant.name, key)
        return [timer_view(t) for t in first]

    def _targets(
        self,
        tenant: Tenant,
        queue_url: str | None,
        url: str | None,
        headers: dict[str, str] | None,
    ) -> tuple[str, Webhook | None]:
        """(queue URL, None) for a queue target, ("", webhook) for an HTTP target."""
        if url is None:
            if headers is not None:
                raise InvalidInput(
                    "headers need an HTTP target",
                    [FieldError("target.headers", "only with target.url")],
                )
            return self._target(tenant, queue_url), None
        if queue_url is not None:
            raise InvalidInput(
                "a target is a queue or a URL, not both",
                [FieldError("target", "give either queue_url or url")],
            )
        webhook, errors = validate_target(
            url, headers, self.allow_loopback_targets, self.local_stack
        )
        if webhook is None:
            raise InvalidInput("invalid HTTP target", errors)
        return "", webhook

    def _target(self, tenant: Tenant, queue_url: str | None) -> str:
        if queue_url is None:
            return tenant.callback_queue_url
        if not tenant.may_target(queue_url):
            raise InvalidInput(
                "target queue is not registered for this tenant",
                [FieldError("target.queue_url", "not the tenant's callback queue nor allowed")],
            )
        return queue_url


# left out while unset (their default): old hashes still match
_ADDED_LATER = {
    "target_url": None,
    "target_headers": None,
    "retry": None,
    "window_ms": 0,
    "group": None,
}


def _fields(spec: TimerSpec) -> dict[str, Any]:
    return {
        k: v for k, v in spec.__dict__.items() if not (k in _ADDED_LATER and v == _ADDED_LATER[k])
    }


def _fingerprint(specs: Sequence[TimerSpec], single: bool) -> str:
    canonical = json.dumps(
        {
            "single": single,
            "timers": [{**_fields(s), "schedule": repr(s.schedule)} for s in specs],
        },
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(canonical.encode()).hexdigest()

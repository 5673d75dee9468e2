"""Use cases of the HTTP API. Validated input in, contract views out; the fire path behind
``timers.engine.changes``.

A timer's stored item is its plan and a checkpoint; what a user sees is *derived* by walking
the fire log from that checkpoint. A change (PATCH, pause, resume, reset, delete) is one transaction
ordered with the claim of the timer's cursor (docs/fire-path.md, R5).
"""

from __future__ import annotations

import base64
import binascii
import builtins
import hashlib
import json
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from timers.adapters.delivery_records import DeliveryRecords
from timers.adapters.groups import GroupStore
from timers.adapters.idempotency import IdempotencyRecord, IdempotencyStore
from timers.adapters.tenants import Tenant
from timers.adapters.usage import UsageCounters, add_quietly, month_of
from timers.core import timer as timers
from timers.core.errors import (
    FieldError,
    IdempotencyConflict,
    InvalidInput,
    InvalidState,
    NotFound,
)
from timers.core.groups import check_group, check_name
from timers.core.numbers import is_ascii_digits
from timers.core.schedule import Misfire, Plan, Schedule, preview
from timers.core.timer import Timer
from timers.core.times import format_ms
from timers.core.views import fire_view, timer_view
from timers.core.webhooks import RetryPolicy, Webhook, validate_target
from timers.engine.changes import Changes
from timers.engine.entries import partition_for, ref_of, resolved, spread_of
from timers.engine.extra import Extras, merge

log = logging.getLogger(__name__)

Clock = Callable[[], int]
BATCH_LIMIT = 100
LIST_READ_LIMIT = 1_000
"""Items one list request reads at most (payload items and other statuses included)."""
LIST_READ_BATCH = 100
"""Items read per query when a status filter may discard most of them."""
_MONTH = re.compile(r"([0-9]{4})-([0-9]{2})")  # ASCII digits: ``\d`` takes any script's


def _check_month(month: str, this_month: str) -> None:
    """A month the usage report can answer: YYYY-MM, a real month, not after this one (UTC).
    Each refusal says which of the three it is: a month that has that shape is out of range or
    in the future, not "expected YYYY-MM"."""
    shape = _MONTH.fullmatch(month)
    if shape is None:
        why = "expected YYYY-MM, e.g. 2026-11"
    elif not 1 <= int(shape[2]) <= 12:
        why = f"{month} is out of range: month {shape[2]} is not 01-12"
    elif shape[1] == "0000":
        why = f"{month} is out of range: the year is 0001 to 9999"
    elif month > this_month:  # both YYYY-MM: their order is the months' order
        why = f"{month} is in the future: this month is {this_month} (UTC)"
    else:
        return
    raise InvalidInput("invalid month", [FieldError("month", why)])


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


@dataclass
class TimerService:
    changes: Changes
    deliveries: DeliveryRecords
    idempotency: IdempotencyStore
    clock: Clock
    allow_loopback_targets: bool = False  # the local stack only (TIMERS_ALLOW_LOOPBACK_TARGETS)
    local_stack: bool = False  # `make run` (TIMERS_LOCAL_STACK): a refusal names its setting
    extras: Extras | None = None  # run now (None: extra fires neither run nor listed)
    usage: UsageCounters | None = None  # the tenants' usage counters (None: not counted)
    groups: GroupStore | None = None  # the tenants' groups (None: their registry not kept)

    @property
    def timers(self) -> Any:
        return self.changes.timers

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

    # ---------------------------------------------------------------- usage

    def _created(self, tenant: Tenant, built: Sequence[Timer]) -> None:
        if self.usage is None or not built:
            return
        active = sum(t.status == "active" for t in built)
        add_quietly(self.usage, tenant.name, month_of(built[0].created_ms),
                    {"timers_created": len(built), "active": active})  # fmt: skip

    def status_moved(self, tenant: str, before: str, after: str | None) -> None:
        """A committed change moved a timer in or out of ``active``: the gauge follows."""
        delta = (after == "active") - (before == "active")
        if self.usage is None or not delta:
            return
        add_quietly(self.usage, tenant, month_of(self.clock()), {"active": delta})

    def usage_of(self, tenant: Tenant, month: str | None) -> dict[str, Any]:
        """The tenant's usage of ``month`` (YYYY-MM, UTC; None: this month)."""
        this_month = month_of(self.clock())
        if month is None:
            month = this_month
        else:
            _check_month(month, this_month)
        if self.usage is None:
            raise InvalidState("usage is not counted here")
        first = month_of(tenant.created_ms) if tenant.created_ms else month
        return self.usage.read(tenant.name, month, first)

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

    # ---------------------------------------------------------------- read

    def get(self, tenant: Tenant, timer_id: str) -> dict[str, Any]:
        return timer_view(self.changes.current(self._load(tenant, timer_id))[0])

    def list(
        self,
        tenant: Tenant,
        status: str | None,
        limit: int,
        cursor: str | None,
        group: str | None = None,
    ) -> dict[str, Any]:
        """A page of the tenant's timers by id; ``status`` filters the derived status, ``group``
        reads only that group's timers (the table's group index). One request reads at most
        LIST_READ_LIMIT items: a filtered page can be short, even empty, with a cursor to go on
        from (as DynamoDB's own filtered queries are)."""
        scope = f"timers:{status or '*'}"
        if group is not None:
            scope += f":{check_name(group)}"
        after = decode_cursor(cursor, tenant, scope)
        batch = limit if status is None else LIST_READ_BATCH
        items: builtins.list[Timer] = []
        read = 0
        while len(items) < limit and read < LIST_READ_LIMIT:
            if group is None:
                page, next_after = self.timers.page(tenant.name, after, batch)
            else:
                page, next_after = self.timers.group_page(tenant.name, group, after, batch)
            read += batch
            cursors = self.changes.walks(page, consistent=False)
            shown = [resolved(t, c) for t, c in zip(page, cursors, strict=True)]
            matches = [t for t in shown if status is None or t.status == status]
            wanted = limit - len(items)
            if len(matches) >= wanted:  # the page is full: go on after its last timer
                items += matches[:wanted]
                after = items[-1].id if next_after or len(matches) > wanted else None
                break
            items += matches
            after = next_after
            if after is None:
                break
        return {
            "items": [timer_view(t) for t in items],
            "next_cursor": encode_cursor(after, tenant, scope),
        }

    def fire_history(
        self, tenant: Tenant, timer_id: str, limit: int, cursor: str | None
    ) -> dict[str, Any]:
        """Newest first, from the fire log: the timer's chain back along ``pv``, merged with
        its extra fires (run now). The timer is found for this tenant first. A cursor holds
        where the chain goes on and the position extra fires must be below."""
        timer, at = self.changes.current(self._load(tenant, timer_id))
        scope = f"fires:{timer_id}"
        before = decode_cursor(cursor, tenant, scope)
        newest = at.pos if at.pending is not None else timer.last_fire_pos
        start, below = _history_cursor(before) if before is not None else (newest, None)
        chain, more = self.changes.fires(timer, start, limit) if start is not None else ([], None)
        extras, floor = (
            self.extras.fires(timer, below, limit)
            if self.extras is not None and below != 0
            else ([], None)
        )
        fires, chain_next, extras_below = merge(chain, more, extras, floor, limit)
        refs = {pos: ref_of(timer, pos) for pos, e in fires if e.hook}
        records = self.deliveries.read_deliveries(refs.values()) if refs else {}
        go_on = None
        if chain_next is not None or extras_below:
            go_on = f"{'' if chain_next is None else chain_next}|{extras_below}"
        return {
            "items": [
                fire_view(timer.id, pos, entry, records.get(refs[pos]) if pos in refs else None)
                for pos, entry in fires
            ],
            "next_cursor": encode_cursor(go_on, tenant, scope),
        }

    def run_now(self, tenant: Tenant, timer_id: str) -> dict[str, Any]:
        """One extra fire now, besides the schedule: its own fire id, claimed like any fire,
        not counted toward max_fires, whatever the timer's status (timers.engine.extra)."""
        if self.extras is None:
            raise InvalidState("run now is not available here")

        def load() -> tuple[Timer, int | None]:
            stored = self._load(tenant, timer_id)
            return stored, self.changes.current(stored)[1].pos

        timer, pos, entry = self.extras.run(load)
        return fire_view(timer.id, pos, entry)  # an HTTP target's: on the delivery queue

    def preview(self, plan: Plan, count: int) -> dict[str, Any]:
        return {"fire_times": [format_ms(ms) for ms in preview(plan, count)]}

    def _load(self, tenant: Tenant, timer_id: str) -> Timer:
        timer = self.timers.get(tenant.name, timer_id)
        if timer is None:
            raise NotFound(f"no timer {timer_id!r}")
        return timer

    # ---------------------------------------------------------------- change

    def patch(self, tenant: Tenant, timer_id: str, changes: dict[str, Any]) -> dict[str, Any]:
        if "target" in changes:
            target = changes.pop("target") or {}
            queue_url, webhook = self._targets(
                tenant, target.get("queue_url"), target.get("url"), target.get("headers")
            )
            changes = {**changes, "target_queue_url": queue_url, "webhook": webhook}
        if changes.get("group") is not None and self.groups is not None:
            check_group(changes["group"])
            self.groups.touch(tenant.name, [changes["group"]], self.clock())
        return self._change(tenant, timer_id, lambda t, now: timers.patch(t, changes, now))

    def pause(self, tenant: Tenant, timer_id: str) -> dict[str, Any]:
        return self._change(tenant, timer_id, timers.pause)

    def resume(self, tenant: Tenant, timer_id: str) -> dict[str, Any]:
        return self._change(tenant, timer_id, timers.resume)

    def reset(self, tenant: Tenant, timer_id: str) -> dict[str, Any]:
        """Restart the schedule from now, fire count 0. It comes after a fire already claimed
        (waited for, not adopted): nothing of the old schedule is sent once it answers."""
        return self._change(tenant, timer_id, timers.reset, after_owed=True)

    def delete(self, tenant: Tenant, timer_id: str) -> None:
        self._change(tenant, timer_id, None)

    def _change(
        self,
        tenant: Tenant,
        timer_id: str,
        change: Callable[[Timer, int], Timer] | None,
        after_owed: bool = False,
    ) -> dict[str, Any]:
        changed = self.changes.change(tenant.name, timer_id, change, after_owed)
        if changed is None:
            return {}
        timer, shown = changed
        return timer_view(resolved(timer, shown))


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


# ---------------------------------------------------------------- cursors
# Opaque to clients; bound to the tenant and the listing they came from, so one tenant's
# cursor is rejected for another (even though each query is already scoped to its tenant).


def _history_cursor(position: str) -> tuple[int | None, int | None]:
    """(where the chain goes on, the position extra fires are below) of a history cursor;
    a cursor of before extra fires is the chain's position alone."""
    chain, _, below = position.partition("|")
    if not all(is_ascii_digits(part) for part in (chain, below) if part):
        raise InvalidInput(
            "invalid cursor", [FieldError("cursor", "not a cursor this listing returned")]
        )
    return (int(chain) if chain else None), (int(below) if below else None)


def encode_cursor(position: str | None, tenant: Tenant, scope: str) -> str | None:
    if position is None:
        return None
    raw = json.dumps({"t": tenant.name, "s": scope, "p": position}, separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(cursor: str | None, tenant: Tenant, scope: str) -> str | None:
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

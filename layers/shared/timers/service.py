"""Use cases of the HTTP API. Validated input in, contract views out; storage through ports.

A timer's stored item is its plan and a checkpoint; what a user sees is *derived* by walking the
claim entries from that checkpoint (timers.core.chain). A change (PATCH, pause, resume, delete)
is one transaction with a tombstone on the timer's cursor, so it is ordered before or after any
claim of that position, never in between (docs/fire-path.md, "Changes serialize with claims").
"""

from __future__ import annotations

import base64
import binascii
import builtins
import hashlib
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol, TypeVar

from timers.adapters.claims import ClaimStore
from timers.adapters.idempotency import IdempotencyStore
from timers.adapters.tenants import Tenant
from timers.adapters.timers_table import TimerStore
from timers.adapters.wakeups import WakeupStore
from timers.core import timer as timers
from timers.core.chain import (
    Cursor,
    Entry,
    Member,
    drive,
    entry_ref,
    history,
    partition_for,
    resolved,
    settled,
    tombstone,
    walk,
)
from timers.core.errors import (
    ConcurrentUpdate,
    FieldError,
    IdempotencyConflict,
    InvalidInput,
    NotFound,
)
from timers.core.schedule import Misfire, Plan, Schedule, is_recurring, next_fire, preview
from timers.core.timer import Timer
from timers.core.times import format_ms
from timers.core.views import fire_view, timer_view
from timers.core.webhooks import Webhook, validate_target

log = logging.getLogger(__name__)

Clock = Callable[[], int]
T = TypeVar("T")
WRITE_ATTEMPTS = 5
BATCH_LIMIT = 100
LIST_READ_LIMIT = 1_000
"""Items one list request reads at most (payload items and other statuses included)."""
LIST_READ_BATCH = 100
"""Items read per query when a status filter may discard most of them."""


class DueIndex(Protocol):
    """The Redis side of the fast path (timers.adapters.redis_index.RedisIndex)."""

    def ensure(self, placements: Any) -> int: ...

    def replace(
        self, bucket: int, timer_id: str, rev: int, member: Member | None, card: str | None
    ) -> bool: ...

    def recard(self, partition: int, timer_id: str, rev: int, card: str) -> bool: ...


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


@dataclass
class TimerService:
    timers: TimerStore
    claims: ClaimStore
    wakeups: WakeupStore
    idempotency: IdempotencyStore
    clock: Clock
    lookahead_ms: int
    retention_ms: int
    bucket_count: int
    index: DueIndex | None = None
    allow_loopback_targets: bool = False  # the local stack only (TIMERS_ALLOW_LOOPBACK_TARGETS)

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
        built: list[Timer] = []
        errors: list[FieldError] = []
        for i, spec in enumerate(specs):
            try:
                built.append(self._build(tenant, spec, timers.new_timer_id(), now))
            except InvalidInput as exc:
                if single:
                    raise
                errors += [FieldError(f"timers[{i}].{e.field}", e.message) for e in exc.details]
        if errors:
            raise InvalidInput("some timers of the batch are invalid; none was created", errors)
        if idempotency_key is None:
            self._store_new(built)
            return [timer_view(t) for t in built]
        return self._create_once(tenant, idempotency_key, specs, built, single)

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
        )
        partition = partition_for(tenant.name, timer_id, tenant.spread)
        return self._with_expiry(replace(timer, rev=1, partition=partition), now)

    def _create_once(
        self,
        tenant: Tenant,
        key: str,
        specs: Sequence[TimerSpec],
        built: list[Timer],
        single: bool,
    ) -> list[dict[str, Any]]:
        body_hash = _fingerprint(specs, single)
        ids = [t.id for t in built]
        seen = self.idempotency.claim(tenant.name, key, body_hash, ids, built[0].created_ms)
        if seen is not None and seen.body_hash != body_hash:
            raise IdempotencyConflict(
                "this Idempotency-Key was already used with a different request body"
            )
        if seen is not None and seen.response is not None:
            return list(json.loads(seen.response))
        if seen is None:
            self._store_new(built)
            views = [timer_view(t) for t in built]
        else:
            # A first attempt is in flight or died before answering: create under the ids it
            # recorded, one by one and only if absent, so a key never makes two sets of timers.
            views = []
            for timer, timer_id in zip(built, seen.timer_ids, strict=True):
                partition = partition_for(tenant.name, timer_id, tenant.spread)
                again = replace(timer, id=timer_id, partition=partition)
                try:
                    self._store_new([again])
                    views.append(timer_view(again))
                except ConcurrentUpdate:
                    views.append(self.get(tenant, timer_id))
        self.idempotency.complete(tenant.name, key, json.dumps(views))
        return views

    def _store_new(self, created: Sequence[Timer]) -> None:
        """Wakeups first (a wakeup without its timer is dead), then the timers (their big
        payloads first), then the fast path: what is due within the look-ahead goes into Redis
        now."""
        one_shots = [t for t in created if _member(t) is not None and not is_recurring(t.schedule)]
        if one_shots:
            self.wakeups.put(self.wakeups.items((t.partition, _placed(t)) for t in one_shots))
        try:
            self.timers.create(created)
        except Exception:  # all or nothing: take back what a batch wrote before it failed
            self.timers.remove_new(created)
            raise
        soon = [t for t in created if self._due_soon(t)]
        if soon and self.index is not None:
            try:
                self.index.ensure([(t.partition, _placed(t), timers.to_card(t)) for t in soon])
            except Exception:  # the migrator puts them in from DynamoDB; this only costs time
                log.warning("fast path failed; the migrator will catch up", exc_info=True)

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
        webhook, errors = validate_target(url, headers, self.allow_loopback_targets)
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
        return timer_view(self._current(self._load(tenant, timer_id))[0])

    def list(
        self, tenant: Tenant, status: str | None, limit: int, cursor: str | None
    ) -> dict[str, Any]:
        """A page of the tenant's timers by id; ``status`` filters the derived status. One
        request reads at most LIST_READ_LIMIT items: a filtered page can be short, even empty,
        with a cursor to go on from (as DynamoDB's own filtered queries are)."""
        scope = f"timers:{status or '*'}"
        after = decode_cursor(cursor, tenant, scope)
        batch = limit if status is None else LIST_READ_BATCH
        items: builtins.list[Timer] = []
        read = 0
        while len(items) < limit and read < LIST_READ_LIMIT:
            page, next_after = self.timers.page(tenant.name, after, batch)
            read += batch
            shown = self._resolve(page, consistent=False)
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
        """Newest first, from the claim entries: the timer is found for this tenant first."""
        timer, at = self._current(self._load(tenant, timer_id))
        scope = f"fires:{timer_id}"
        before = decode_cursor(cursor, tenant, scope)
        newest = at.pos if at.pending is not None else timer.last_fire_pos
        start = int(before) if before is not None else newest
        [(fires, more)] = drive(
            [history(timer.partition, timer.id, start, limit)], self.claims.read
        )
        hooks = [entry_ref(timer.partition, timer.id, pos) for pos, entry in fires if entry.hook]
        deliveries = self.claims.read_deliveries(hooks) if hooks else {}
        return {
            "items": [
                fire_view(
                    timer.id,
                    pos,
                    entry,
                    deliveries.get(entry_ref(timer.partition, timer.id, pos)),
                )
                for pos, entry in fires
            ],
            "next_cursor": encode_cursor(None if more is None else str(more), tenant, scope),
        }

    def preview(self, plan: Plan, count: int) -> dict[str, Any]:
        return {"fire_times": [format_ms(ms) for ms in preview(plan, count)]}

    def _load(self, tenant: Tenant, timer_id: str) -> Timer:
        timer = self.timers.get(tenant.name, timer_id)
        if timer is None:
            raise NotFound(f"no timer {timer_id!r}")
        return timer

    def _resolve(self, stored: Sequence[Timer], consistent: bool = False) -> Sequence[Timer]:
        return [resolved(t, c) for t, c in zip(stored, self._walk(stored, consistent), strict=True)]

    def _walk(self, stored: Sequence[Timer], consistent: bool) -> builtins.list[Cursor]:
        return drive(
            [walk(t) for t in stored],
            lambda refs: self.claims.read(refs, consistent=consistent),
        )

    def _current(self, stored: Timer) -> tuple[Timer, Cursor]:
        """The derived timer, and its cursor (consistent reads)."""
        (cursor,) = self._walk([stored], consistent=True)
        return resolved(stored, cursor), cursor

    # ---------------------------------------------------------------- change

    def patch(self, tenant: Tenant, timer_id: str, changes: dict[str, Any]) -> dict[str, Any]:
        if "target" in changes:
            target = changes.pop("target") or {}
            queue_url, webhook = self._targets(
                tenant, target.get("queue_url"), target.get("url"), target.get("headers")
            )
            changes = {**changes, "target_queue_url": queue_url, "webhook": webhook}
        return self._change(tenant, timer_id, lambda t, now: timers.patch(t, changes, now))

    def pause(self, tenant: Tenant, timer_id: str) -> dict[str, Any]:
        return self._change(tenant, timer_id, timers.pause)

    def resume(self, tenant: Tenant, timer_id: str) -> dict[str, Any]:
        return self._change(tenant, timer_id, timers.resume)

    def delete(self, tenant: Tenant, timer_id: str) -> None:
        self._change(tenant, timer_id, None)

    def _change(
        self, tenant: Tenant, timer_id: str, change: Callable[[Timer, int], Timer] | None
    ) -> dict[str, Any]:
        """Re-read, derive, apply, and commit in one transaction that is ordered with the claim
        of the timer's cursor (docs/fire-path.md, R5): an unclaimed cursor is fenced; a claimed
        one is owed - it is still sent, and the change is *adopted* into its entry, so the new
        revision continues after it. A claim or another change that got there first makes the
        transaction fail, and the change starts over."""

        def attempt() -> dict[str, Any]:
            stored = self._load(tenant, timer_id)
            current, cursor = self._current(stored)
            base = settled(stored, cursor)  # as if the owed fire, if any, had finished
            now = self.clock()
            after = None if change is None else change(base, now)
            if after is not None and after == base:
                return timer_view(current)
            new_rev = stored.rev + 1
            if after is not None:
                after = replace(after, rev=new_rev, owed=False)
                if after.anchor_ms != base.anchor_ms:  # a new schedule
                    after = self._first_unclaimed(after)
            owed, pos = cursor.pending, cursor.pos
            writes: list[dict[str, Any]] = []
            kept, listed = after, [after]
            if owed is not None and pos is not None:
                ref = entry_ref(stored.partition, stored.id, pos)
                if after is not None:  # a deleted timer's owed fire goes if its claimant lives
                    writes.append(self.claims.adopt_update(ref, _adopted(owed, after), owed))
                    # The stored cursor stays on the owed fire until it is recorded (R3); until
                    # then the timer counts as active and stays findable (R4).
                    kept = replace(
                        after,
                        next_fire_ms=pos,
                        fire_count=cursor.n,
                        last_fire_pos=cursor.last,
                        status="active" if after.status == "completed" else after.status,
                        owed=after.status != "active",
                    )
                    listed = [kept, after]
            elif pos is not None:
                ref = entry_ref(stored.partition, stored.id, pos)
                writes.append(self.claims.fence_update(ref, tombstone(new_rev)))
            if kept is not None:
                kept = self._with_expiry(kept, now, later=after)
            writes[:0] = self.timers.change_writes(stored, kept)
            placed = [(t.partition, m) for t in listed if t and (m := _member(t, listed=True))]
            for wakeup in self.wakeups.items(placed) if placed else []:
                writes.append({"Put": {"TableName": _table(wakeup), "Item": wakeup.serialize()}})
            self.timers.transact(writes)
            self._sync(stored, kept, new_rev, adopted=owed is not None)
            if kept is None:
                return {}
            shown = Cursor(kept.next_fire_ms, kept.fire_count, kept.last_fire_pos, owed)
            return timer_view(resolved(kept, shown))

        return _retry_on_conflict(attempt)

    def _first_unclaimed(self, timer: Timer) -> Timer:
        """A new schedule starts at an occurrence the timer has not claimed: fire ids are
        ``<timer id>:<due ms>``, and one that fired is never fired again. A recurring schedule
        moves on to its next occurrence; a one-shot at a time that already fired is refused."""
        for _ in range(WRITE_ATTEMPTS):
            pos = timer.next_fire_ms
            if pos is None:
                return timer
            ref = entry_ref(timer.partition, timer.id, pos)
            found = self.claims.read([ref], consistent=True)[ref]
            if found is None or found.state == "t":
                return timer
            if not is_recurring(timer.schedule):
                raise InvalidInput(
                    "the timer already fired at that time",
                    [FieldError("schedule", f"{format_ms(pos)} already fired; choose another")],
                )
            timer = timers.with_cursor(timer, next_fire(timer.plan, pos))
        raise ConcurrentUpdate("the new schedule's first occurrences are all claimed")

    def _sync(self, before: Timer, after: Timer | None, rev: int, adopted: bool) -> None:
        """Keep Redis in step with a committed change; DynamoDB stays the truth if Redis is
        unreachable (the fence already stops the old position). An adopted change only updates
        the timer's card: the owed fire's member stays the head, and chains the new revision."""
        if self.index is None:
            return
        try:
            if adopted and after is not None:
                self.index.recard(before.partition, before.id, rev, timers.to_card(after))
                return
            soon = after is not None and self._due_soon(after)
            self.index.replace(
                before.partition,
                before.id,
                rev,
                _placed(after) if soon and after is not None else None,
                timers.to_card(after) if soon and after is not None else None,
            )
        except Exception:
            log.warning("fast path failed; the migrator will catch up", exc_info=True)

    def _due_soon(self, timer: Timer) -> bool:
        member = _member(timer)
        return member is not None and member.due <= self.clock() + self.lookahead_ms

    def _with_expiry(self, timer: Timer, now: int, later: Timer | None = None) -> Timer:
        """When the timer is deleted: a one-shot ``retention`` after it fires - its due time, or
        now if that has passed (set ahead, so firing it writes nothing; ``later``: the
        re-armed one-shot that follows an owed fire); a timer completed by a change
        ``retention`` from now."""
        if timer.status == "completed":
            return replace(timer, expires_ms=now + self.retention_ms)
        dues = [t.next_fire_ms for t in (timer, later) if t is not None and t.status == "active"]
        due = max((d for d in dues if d is not None), default=None)
        if timer.status == "active" and due is not None and not is_recurring(timer.schedule):
            # from its fire, which is now at the earliest (a one-shot resumed after a long pause)
            return replace(timer, expires_ms=max(due, now) + self.retention_ms)
        return replace(timer, expires_ms=None)


def _member(timer: Timer, listed: bool = False) -> Member | None:
    """The Redis member an active timer's cursor stands for; ``listed``: the wakeup listing a
    one-shot needs for it (also while it owes a claimed fire)."""
    if listed and is_recurring(timer.schedule):
        return None
    live = timer.status == "active" or (listed and timer.owed)
    if not live or timer.next_fire_ms is None:
        return None
    return Member(
        timer.tenant, timer.id, timer.next_fire_ms, timer.rev, timer.fire_count,
        timer.last_fire_pos,
    )  # fmt: skip


def _placed(timer: Timer) -> Member:
    member = _member(timer)
    assert member is not None
    return member


def _adopted(owed: Entry, after: Timer) -> Entry:
    """A pending entry handed to the change's revision: its successor is the change's next
    position (a pause leaves it be: nothing chains a paused timer)."""
    if after.status == "paused":
        return replace(owed, rev=after.rev)
    following = after.next_fire_ms if after.status == "active" else None
    return replace(owed, rev=after.rev, next=following, end=following is None)


def _table(item: Any) -> str:
    return str(type(item).Meta.table_name)


def _retry_on_conflict(attempt: Callable[[], T]) -> T:
    """Optimistic concurrency: re-read and re-apply when a claim or another writer won."""
    for _ in range(WRITE_ATTEMPTS - 1):
        try:
            return attempt()
        except ConcurrentUpdate:
            continue
    return attempt()


_ADDED_LATER = ("target_url", "target_headers")  # left out while unset: old hashes still match


def _fields(spec: TimerSpec) -> dict[str, Any]:
    return {k: v for k, v in spec.__dict__.items() if not (k in _ADDED_LATER and v is None)}


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

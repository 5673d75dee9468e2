"""DynamoDB adapter (pynamodb): timers are the source of truth; fires hold claims and history.

Tables (see template.yaml):
- timers: (tenant, timer_id); sparse GSI ``due-index`` (due_shard, next_fire_ms), keys only.
  Keying on the tenant keeps tenants apart by construction; the due index is sharded by a
  stable hash of the timer id so no minute and no tenant becomes a hot partition.
- fires: fire_id; GSI ``timer-index`` (timer_key, scheduled_ms) for a timer's history.
- idempotency: "<tenant>|<key>" -> the first response, 24 h TTL.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from pynamodb.attributes import (
    NumberAttribute,
    TTLAttribute,
    UnicodeAttribute,
    VersionAttribute,
)
from pynamodb.exceptions import DeleteError, PutError, UpdateError
from pynamodb.indexes import AllProjection, GlobalSecondaryIndex, KeysOnlyProjection
from pynamodb.models import Model

from timers.config import Settings
from timers.core.errors import ConcurrentUpdate
from timers.core.schedule import schedule_from_dict, schedule_to_dict
from timers.core.timer import Timer
from timers.core.timer import fire_id as timer_fire_id
from timers.core.times import from_ms

# ---------------------------------------------------------------- models


class DueIndex(GlobalSecondaryIndex["TimerItem"]):
    class Meta:
        index_name = "due-index"
        projection = KeysOnlyProjection()

    due_shard = UnicodeAttribute(hash_key=True)
    next_fire_ms = NumberAttribute(range_key=True)


class TimerItem(Model):
    class Meta:
        table_name = "timers"

    tenant = UnicodeAttribute(hash_key=True)
    timer_id = UnicodeAttribute(range_key=True)
    name = UnicodeAttribute(null=True)
    schedule = UnicodeAttribute()  # the contract's schedule JSON
    anchor_ms = NumberAttribute()
    start_ms = NumberAttribute(null=True)
    end_ms = NumberAttribute(null=True)
    max_fires = NumberAttribute(null=True)
    target_queue_url = UnicodeAttribute()
    payload = UnicodeAttribute()
    misfire = UnicodeAttribute()
    status = UnicodeAttribute()
    next_fire_ms = NumberAttribute(null=True)
    due_shard = UnicodeAttribute(null=True)  # present only while due-indexed (sparse GSI)
    fire_count = NumberAttribute(default=0)
    created_ms = NumberAttribute()
    updated_ms = NumberAttribute()
    version = VersionAttribute()
    due_index = DueIndex()


class TimerFiresIndex(GlobalSecondaryIndex["FireItem"]):
    class Meta:
        index_name = "timer-index"
        projection = AllProjection()

    timer_key = UnicodeAttribute(hash_key=True)
    scheduled_ms = NumberAttribute(range_key=True)


class FireItem(Model):
    class Meta:
        table_name = "fires"

    fire_id = UnicodeAttribute(hash_key=True)
    timer_key = UnicodeAttribute()  # "<tenant>|<timer id>": a tenant reads only its own history
    scheduled_ms = NumberAttribute()
    status = UnicodeAttribute()  # pending | enqueued | failed
    enqueued_ms = NumberAttribute(null=True)
    lag_ms = NumberAttribute(null=True)
    claim_owner = UnicodeAttribute(null=True)
    claim_until_ms = NumberAttribute(null=True)
    attempts = NumberAttribute(default=0)
    reason = UnicodeAttribute(null=True)
    expires_at = TTLAttribute(null=True)
    by_timer = TimerFiresIndex()


class IdempotencyItem(Model):
    class Meta:
        table_name = "idempotency"

    pk = UnicodeAttribute(hash_key=True)
    body_hash = UnicodeAttribute()
    timer_id = UnicodeAttribute()
    state = UnicodeAttribute()  # pending | done
    response = UnicodeAttribute(null=True)
    created_ms = NumberAttribute()
    expires_at = TTLAttribute()


def bind_tables(settings: Settings) -> None:
    """Point the models at this deployment's tables (names come from the environment)."""
    TimerItem.Meta.table_name = settings.timers_table
    FireItem.Meta.table_name = settings.fires_table
    IdempotencyItem.Meta.table_name = settings.idempotency_table


# ---------------------------------------------------------------- timers


def due_shard(timer_id: str, shards: int) -> str:
    return str(zlib.crc32(timer_id.encode()) % shards)


def timer_key(tenant: str, timer_id: str) -> str:
    return f"{tenant}|{timer_id}"


def _to_timer(item: TimerItem) -> Timer:
    return Timer(
        tenant=item.tenant,
        id=item.timer_id,
        schedule=schedule_from_dict(json.loads(item.schedule)),
        anchor_ms=int(item.anchor_ms),
        target_queue_url=item.target_queue_url,
        payload_json=item.payload,
        misfire=item.misfire,  # type: ignore[arg-type]
        name=item.name,
        start_ms=_int(item.start_ms),
        end_ms=_int(item.end_ms),
        max_fires=_int(item.max_fires),
        status=item.status,  # type: ignore[arg-type]
        next_fire_ms=_int(item.next_fire_ms),
        fire_count=int(item.fire_count),
        created_ms=int(item.created_ms),
        updated_ms=int(item.updated_ms),
        version=_int(item.version),
    )


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


@dataclass
class TimerStore:
    """Reads and conditional writes of timers; every call is scoped to one tenant."""

    due_shards: int

    def _to_item(self, timer: Timer) -> TimerItem:
        item = TimerItem(
            timer.tenant,
            timer.id,
            name=timer.name,
            schedule=json.dumps(schedule_to_dict(timer.schedule)),
            anchor_ms=timer.anchor_ms,
            start_ms=timer.start_ms,
            end_ms=timer.end_ms,
            max_fires=timer.max_fires,
            target_queue_url=timer.target_queue_url,
            payload=timer.payload_json,
            misfire=timer.misfire,
            status=timer.status,
            next_fire_ms=timer.next_fire_ms,
            due_shard=due_shard(timer.id, self.due_shards) if timer.is_due_indexed else None,
            fire_count=timer.fire_count,
            created_ms=timer.created_ms,
            updated_ms=timer.updated_ms,
        )
        if timer.version is not None:  # None: a new item, saved only if absent
            item.version = timer.version
        return item

    def get(self, tenant: str, timer_id: str) -> Timer | None:
        try:
            return _to_timer(TimerItem.get(tenant, timer_id, consistent_read=True))
        except TimerItem.DoesNotExist:
            return None

    def put(self, timer: Timer) -> Timer:
        """Create (version None: the item must not exist) or replace the version we read.

        Raises ConcurrentUpdate when another writer got there first.
        """
        item = self._to_item(timer)
        try:
            item.save()
        except PutError as exc:
            if _conditional_failed(exc):
                raise ConcurrentUpdate("the timer was changed concurrently; retry") from exc
            raise
        return _to_timer(item)

    def delete(self, timer: Timer) -> None:
        try:
            self._to_item(timer).delete()
        except DeleteError as exc:
            if _conditional_failed(exc):
                raise ConcurrentUpdate("the timer was changed concurrently; retry") from exc
            raise

    def get_many(self, keys: Iterable[tuple[str, str]]) -> dict[tuple[str, str], Timer]:
        """Consistent batch read of (tenant, timer id) keys; missing timers are absent."""
        wanted = set(keys)  # BatchGetItem rejects duplicate keys
        if not wanted:
            return {}
        return {
            (item.tenant, item.timer_id): _to_timer(item)
            for item in TimerItem.batch_get(wanted, consistent_read=True)
        }

    def list(
        self, tenant: str, status: str | None, limit: int, after_id: str | None
    ) -> tuple[list[Timer], str | None]:
        """One page of a tenant's timers by id, optionally of one status; returns the last id."""
        condition = TimerItem.status == status if status else None
        start = {"tenant": {"S": tenant}, "timer_id": {"S": after_id}} if after_id else None
        results = TimerItem.query(
            tenant,
            filter_condition=condition,
            limit=limit,
            last_evaluated_key=start,
            consistent_read=True,
        )
        timers = [_to_timer(item) for item in results]
        more = results.last_evaluated_key is not None and len(timers) == limit
        return timers, (timers[-1].id if more and timers else None)


def _conditional_failed(exc: PutError | UpdateError | DeleteError) -> bool:
    return exc.cause_response_code == "ConditionalCheckFailedException"


# ---------------------------------------------------------------- fires


@dataclass(frozen=True)
class FireRecord:
    fire_id: str
    scheduled_ms: int
    status: str
    enqueued_ms: int | None
    lag_ms: int | None
    reason: str | None = None


def _to_fire(item: FireItem) -> FireRecord:
    return FireRecord(
        fire_id=item.fire_id,
        scheduled_ms=int(item.scheduled_ms),
        status=item.status,
        enqueued_ms=_int(item.enqueued_ms),
        lag_ms=_int(item.lag_ms),
        reason=item.reason,
    )


class FireStore:
    """A timer's fire history (the trigger writes it; see the fire path)."""

    def history(
        self, tenant: str, timer_id: str, limit: int, after_ms: int | None
    ) -> tuple[list[FireRecord], int | None]:
        """One page, newest first; returns the scheduled_ms to continue before."""
        key = timer_key(tenant, timer_id)
        condition = FireItem.scheduled_ms < after_ms if after_ms is not None else None
        results = FireItem.by_timer.query(
            key, range_key_condition=condition, scan_index_forward=False, limit=limit
        )
        fires = [_to_fire(item) for item in results]
        more = results.last_evaluated_key is not None and len(fires) == limit
        return fires, (fires[-1].scheduled_ms if more and fires else None)


# The trigger's side of a fire: one conditional write claims it before the send, a second one
# (valid only while the claim is still ours) records the outcome.

Claim = Literal["claimed", "done", "held"]
"""claimed: ours to send; done: already enqueued or failed; held: another live claimant has it."""


class FireClaims:
    """Claim and record fires for the trigger (conditional writes on the fires table)."""

    def __init__(self, retention_days: int) -> None:
        self.retention_days = retention_days

    def claim(
        self, tenant: str, timer_id: str, fire_ms: int, owner: str, now_ms: int, claim_ms: int
    ) -> Claim:
        """Create the fire as ``pending`` under ``owner`` for ``claim_ms``, or take over a
        pending claim that has expired (its claimant died: the fire is re-sent, not lost)."""
        fire_id = timer_fire_id(timer_id, fire_ms)
        free = FireItem.fire_id.does_not_exist() | (
            (FireItem.status == "pending") & (FireItem.claim_until_ms < now_ms)
        )
        try:
            FireItem(fire_id).update(
                actions=[
                    FireItem.timer_key.set(timer_key(tenant, timer_id)),
                    FireItem.scheduled_ms.set(fire_ms),
                    FireItem.status.set("pending"),
                    FireItem.claim_owner.set(owner),
                    FireItem.claim_until_ms.set(now_ms + claim_ms),
                    FireItem.attempts.add(1),
                    FireItem.expires_at.set(fire_expiry(now_ms, self.retention_days)),
                ],
                condition=free,
            )
            return "claimed"
        except UpdateError as exc:
            if not _conditional_failed(exc):
                raise
        try:
            existing = FireItem.get(fire_id, consistent_read=True)
        except FireItem.DoesNotExist:
            return "held"  # vanished (TTL) between the two calls: let the next lease decide
        return "held" if existing.status == "pending" else "done"

    def record_enqueued(self, fire_id: str, owner: str, enqueued_ms: int, lag_ms: int) -> bool:
        return self._record(
            fire_id,
            owner,
            [
                FireItem.status.set("enqueued"),
                FireItem.enqueued_ms.set(enqueued_ms),
                FireItem.lag_ms.set(lag_ms),
            ],
        )

    def record_failed(self, fire_id: str, owner: str, reason: str) -> bool:
        return self._record(
            fire_id, owner, [FireItem.status.set("failed"), FireItem.reason.set(reason[:1000])]
        )

    def _record(self, fire_id: str, owner: str, actions: list[Any]) -> bool:
        """Write the outcome only while the claim is ours; False if another claimant took over
        (it records the outcome itself)."""
        try:
            FireItem(fire_id).update(actions=actions, condition=FireItem.claim_owner == owner)
            return True
        except UpdateError as exc:
            if _conditional_failed(exc):
                return False
            raise


def fire_expiry(now_ms: int, retention_days: int) -> datetime:
    return from_ms(now_ms).astimezone(UTC) + timedelta(days=retention_days)


# ---------------------------------------------------------------- idempotency


IDEMPOTENCY_TTL = timedelta(hours=24)


@dataclass(frozen=True)
class IdempotencyRecord:
    body_hash: str
    timer_id: str
    response: str | None  # None while the first request is still in flight


class IdempotencyStore:
    def claim(
        self, tenant: str, key: str, body_hash: str, timer_id: str, now_ms: int
    ) -> IdempotencyRecord | None:
        """Record the first use of a key; returns the existing record if the key was used before."""
        pk = f"{tenant}|{key}"
        item = IdempotencyItem(
            pk,
            body_hash=body_hash,
            timer_id=timer_id,
            state="pending",
            created_ms=now_ms,
            expires_at=from_ms(now_ms) + IDEMPOTENCY_TTL,
        )
        # DynamoDB deletes expired items lazily, so an expired record counts as absent
        fresh = IdempotencyItem.pk.does_not_exist() | (
            IdempotencyItem.expires_at <= from_ms(now_ms)
        )
        try:
            item.save(condition=fresh)
            return None
        except PutError as exc:
            if not _conditional_failed(exc):
                raise
        existing = IdempotencyItem.get(pk, consistent_read=True)
        return IdempotencyRecord(existing.body_hash, existing.timer_id, existing.response)

    def complete(self, tenant: str, key: str, response: str) -> None:
        IdempotencyItem(f"{tenant}|{key}").update(
            actions=[IdempotencyItem.state.set("done"), IdempotencyItem.response.set(response)]
        )

"""DynamoDB ``timers`` table (pynamodb): the source of truth of each timer's plan and checkpoint.

Key ``(tenant, timer_id)``: keying on the tenant walls tenants off by construction. A timer is
written when its user changes it; a trigger only moves its checkpoint (every 128 fires, after a
misfire jump, when the chain leaves Redis) and marks a recurring timer completed. Where the
migrator finds timers is the wake listings' business (timers.engine.wake). A payload over
INLINE_PAYLOAD_BYTES lives in its own item ``(tenant, "<id>#payload")`` so rewriting the timer
never costs the payload's size.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from botocore.exceptions import ClientError
from pynamodb.attributes import BooleanAttribute, NumberAttribute, TTLAttribute, UnicodeAttribute
from pynamodb.exceptions import PutError, TransactWriteError, UpdateError
from pynamodb.expressions.update import Action
from pynamodb.models import Model
from pynamodb.transactions import TransactWrite

from timers.core.errors import ConcurrentUpdate
from timers.core.groups import group_of, index_key
from timers.core.schedule import schedule_from_dict, schedule_to_dict
from timers.core.timer import Timer
from timers.core.webhooks import RetryPolicy, Webhook
from timers.store.dynamodb import LowLevelClient, bound_model, failed_because

GROUP_INDEX = "by_group"
"""The table's index of grouped timers: key ``grp`` (``<tenant>#<group>``, set only on a timer
in a group: the index holds nothing else) and ``timer_id``, keys only - so a checkpoint or a
completion, which change neither, never writes it: a group costs no write per fire."""

INLINE_PAYLOAD_BYTES = 512
"""Payloads up to this size sit in the timer item (a timer item then stays within 1 KB: one
write unit); bigger ones in their own item."""

PAYLOAD_SUFFIX = "#payload"


class TimerItem(Model):
    """A timer's item; the schema only, ``models_for`` binds it to a table."""

    tenant = UnicodeAttribute(hash_key=True)
    timer_id = UnicodeAttribute(range_key=True)
    name = UnicodeAttribute(null=True)
    schedule = UnicodeAttribute()  # the contract's schedule JSON
    anchor_ms = NumberAttribute()
    start_ms = NumberAttribute(null=True)
    end_ms = NumberAttribute(null=True)
    max_fires = NumberAttribute(null=True)
    target = UnicodeAttribute()  # the target queue URL (an HTTP target: its URL)
    webhook = UnicodeAttribute(null=True)  # an HTTP target: {"url", "headers"} as JSON
    retry = UnicodeAttribute(null=True)  # the retry policy as JSON (absent: the default)
    window_ms = NumberAttribute(null=True)  # the flexible window (absent: 0, on the dot)
    grain_ms = NumberAttribute(null=True)  # its alignment when created (absent: 0): fixed
    grp = UnicodeAttribute(null=True)  # "<tenant>#<group>" (GROUP_INDEX); absent: in no group
    payload = UnicodeAttribute(null=True)  # None: in the payload item
    misfire = UnicodeAttribute()
    status = UnicodeAttribute()
    ckpt_ms = NumberAttribute(null=True)  # the checkpoint: the cursor when it was written,
    ckpt_n = NumberAttribute(default=0)  # the fires before it,
    ckpt_pv = NumberAttribute(null=True)  # and the chain position before it
    rev = NumberAttribute()
    part = NumberAttribute()  # the claim partition (its Redis bucket: part % BucketCount)
    owed = BooleanAttribute(null=True)  # a fire claimed before the last change is still unsent
    created_ms = NumberAttribute()
    updated_ms = NumberAttribute()
    expires_at = TTLAttribute(null=True)


class PayloadItem(Model):
    """A big payload, beside its timer in the same table (the schema only, as TimerItem)."""

    tenant = UnicodeAttribute(hash_key=True)
    timer_id = UnicodeAttribute(range_key=True)  # "<timer id>#payload"
    body = UnicodeAttribute()
    expires_at = TTLAttribute(null=True)


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True)
class TimerModels:
    """The models on one timers table."""

    timer: type[TimerItem]
    payload: type[PayloadItem]


def models_for(table: str, **settings: Any) -> TimerModels:
    return TimerModels(
        bound_model(TimerItem, table, **settings), bound_model(PayloadItem, table, **settings)
    )


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def _ms(value: datetime | None) -> int | None:
    return None if value is None else int(value.timestamp() * 1000)


def _datetime(ms: int | None) -> datetime | None:
    return None if ms is None else _at(ms)


def _at(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


class MissingPayload(RuntimeError):
    """A timer whose payload item is gone: never sent with a made-up payload."""


def to_timer(item: TimerItem, payload: str | None = None) -> Timer:
    if item.payload is None and payload is None:
        raise MissingPayload(f"the payload item of timer {item.tenant}/{item.timer_id} is missing")
    return Timer(
        tenant=item.tenant,
        id=item.timer_id,
        schedule=schedule_from_dict(json.loads(item.schedule)),
        anchor_ms=int(item.anchor_ms),
        target_queue_url="" if item.webhook else item.target,
        webhook=Webhook.from_json(item.webhook) if item.webhook else None,
        payload_json=item.payload if item.payload is not None else str(payload),
        misfire=item.misfire,  # type: ignore[arg-type]
        name=item.name,
        start_ms=_int(item.start_ms),
        end_ms=_int(item.end_ms),
        max_fires=_int(item.max_fires),
        status=item.status,  # type: ignore[arg-type]
        next_fire_ms=_int(item.ckpt_ms),
        fire_count=int(item.ckpt_n),
        last_fire_pos=_int(item.ckpt_pv),
        created_ms=int(item.created_ms),
        updated_ms=int(item.updated_ms),
        rev=int(item.rev),
        partition=int(item.part),
        expires_ms=_ms(item.expires_at),
        owed=bool(item.owed),
        retry=RetryPolicy.from_json(item.retry),
        window_ms=int(item.window_ms or 0),
        grain_ms=int(item.grain_ms or 0),
        group=group_of(item.grp),
    )


def _external(timer: Timer) -> bool:
    return len(timer.payload_json.encode()) > INLINE_PAYLOAD_BYTES


class TimerStore(LowLevelClient):
    """Reads and writes of timers; every call is scoped to one tenant's key."""

    def __init__(
        self,
        table: str,
        client: Any = None,
        clock: Callable[[], int] = _wall_clock_ms,
        **settings: Any,
    ) -> None:
        """``settings``: pynamodb's, for this store's models (the trigger's: its timeouts)."""
        self.table = table
        self.models = models_for(table, **settings)
        self._client = client
        self._clock = clock  # expired items are hidden, as DynamoDB's TTL deletes them late

    # ---------------------------------------------------------------- items

    def item(self, timer: Timer) -> TimerItem:
        """The timer's stored item; its checkpoint is the timer's cursor as given."""
        return self.models.timer(
            timer.tenant,
            timer.id,
            name=timer.name,
            schedule=json.dumps(schedule_to_dict(timer.schedule)),
            anchor_ms=timer.anchor_ms,
            start_ms=timer.start_ms,
            end_ms=timer.end_ms,
            max_fires=timer.max_fires,
            target=timer.webhook.url if timer.webhook else timer.target_queue_url,
            webhook=timer.webhook.to_json() if timer.webhook else None,
            retry=timer.retry.to_json() if timer.retry else None,
            window_ms=timer.window_ms or None,
            grain_ms=timer.grain_ms or None,
            grp=index_key(timer.tenant, timer.group) if timer.group else None,
            payload=None if _external(timer) else timer.payload_json,
            misfire=timer.misfire,
            status=timer.status,
            ckpt_ms=timer.next_fire_ms,
            ckpt_n=timer.fire_count,
            ckpt_pv=timer.last_fire_pos,
            rev=timer.rev,
            part=timer.partition,
            created_ms=timer.created_ms,
            updated_ms=timer.updated_ms,
            expires_at=_datetime(timer.expires_ms),
            owed=True if timer.owed else None,
        )

    def payload_item(self, timer: Timer) -> PayloadItem | None:
        if not _external(timer):
            return None
        return self.models.payload(
            timer.tenant,
            timer.id + PAYLOAD_SUFFIX,
            body=timer.payload_json,
            expires_at=_datetime(timer.expires_ms),
        )

    # ---------------------------------------------------------------- reads

    def get(self, tenant: str, timer_id: str, consistent: bool = True) -> Timer | None:
        if PAYLOAD_SUFFIX in timer_id:
            return None
        found = self.get_many([(tenant, timer_id)], consistent)
        return found.get((tenant, timer_id))

    def get_many(
        self, keys: Iterable[tuple[str, str]], consistent: bool = True
    ) -> dict[tuple[str, str], Timer]:
        """Batch read of (tenant, timer id) keys, with their big payloads; missing are absent."""
        wanted = {k for k in keys if PAYLOAD_SUFFIX not in k[1]}  # BatchGet rejects duplicates
        if not wanted:
            return {}
        models = self.models
        items = [
            i for i in models.timer.batch_get(wanted, consistent_read=consistent) if self._live(i)
        ]
        external = {(i.tenant, i.timer_id + PAYLOAD_SUFFIX) for i in items if i.payload is None}
        found = models.payload.batch_get(external, consistent_read=consistent) if external else []
        bodies = {(p.tenant, p.timer_id.removesuffix(PAYLOAD_SUFFIX)): p.body for p in found}
        return {
            (i.tenant, i.timer_id): to_timer(i, bodies.get((i.tenant, i.timer_id))) for i in items
        }

    def page(self, tenant: str, after_id: str | None, limit: int) -> tuple[list[Timer], str | None]:
        """A tenant's timers by id after ``after_id``, from the next ``limit`` items read; and
        the id to continue after (None: nothing follows). Payload items and expired timers
        count as read, so a page may be short while more follow."""
        read = self._ids_after(tenant, after_id, limit + 1)
        page, beyond = read[:limit], read[limit:]
        if beyond and PAYLOAD_SUFFIX in beyond[0].timer_id:  # the last timer's own payload
            beyond = self._ids_after(tenant, beyond[0].timer_id, 1)
        more = page[-1].timer_id if beyond else None  # no trailing empty page when it ends
        items = [i for i in page if PAYLOAD_SUFFIX not in i.timer_id and self._live(i)]
        full = self.get_many([(i.tenant, i.timer_id) for i in items if i.payload is None])
        timers = [
            t
            for i in items
            if (t := full.get((i.tenant, i.timer_id)) if i.payload is None else to_timer(i))
        ]
        return timers, more

    def _ids_after(self, tenant: str, after_id: str | None, limit: int) -> list[TimerItem]:
        start = {"tenant": {"S": tenant}, "timer_id": {"S": after_id}} if after_id else None
        query = self.models.timer.query(
            tenant, limit=limit, last_evaluated_key=start, consistent_read=True
        )
        return list(query)

    def group_ids(
        self, tenant: str, group: str, after_id: str | None, limit: int
    ) -> tuple[list[str], bool]:
        """Up to ``limit`` ids of the group's timers after ``after_id``, by id, from the index
        (eventually consistent: a timer that just joined may be missing, one that just left
        still there - callers read the timers themselves); and whether more follow."""
        condition = "grp = :g" + (" AND timer_id > :a" if after_id else "")
        values = {":g": {"S": index_key(tenant, group)}}
        if after_id:
            values[":a"] = {"S": after_id}
        ids: list[str] = []
        start: dict[str, Any] | None = None
        while len(ids) <= limit:
            request: dict[str, Any] = {
                "TableName": self.table,
                "IndexName": GROUP_INDEX,
                "KeyConditionExpression": condition,
                "ExpressionAttributeValues": values,
                "Limit": limit + 1 - len(ids),
            }
            if start:
                request["ExclusiveStartKey"] = start
            response = self.client.query(**request)
            ids += [item["timer_id"]["S"] for item in response.get("Items", [])]
            start = response.get("LastEvaluatedKey")
            if not start:
                break
        return ids[:limit], len(ids) > limit

    def group_page(
        self, tenant: str, group: str, after_id: str | None, limit: int
    ) -> tuple[list[Timer], str | None]:
        """As :meth:`page`, of the group's timers: the index's ids, each timer read
        (consistently) and kept only if it is still in the group."""
        ids, more = self.group_ids(tenant, group, after_id, limit)
        found = self.get_many([(tenant, i) for i in ids])
        timers = [t for i in ids if (t := found.get((tenant, i))) and t.group == group]
        return timers, (ids[-1] if more and ids else None)

    def _live(self, item: TimerItem) -> bool:
        expires = _ms(item.expires_at)
        return expires is None or expires > self._clock()

    # ---------------------------------------------------------------- writes

    def create(self, timers: Sequence[Timer]) -> None:
        """New timers (and their big payloads, written first: a timer never exists without its
        payload): one conditional put for a single timer, batch writes for many (their ids are
        new and random; a retry of the same request takes the idempotency path, which creates
        one by one)."""
        if len(timers) == 1:
            self.create_one(timers[0])
            return
        payloads = [p for p in map(self.payload_item, timers) if p is not None]
        if payloads:
            with self.models.payload.batch_write() as batch:
                for payload in payloads:
                    batch.save(payload)
        with self.models.timer.batch_write() as batch:
            for timer in timers:
                batch.save(self.item(timer))

    def create_guarded(
        self, timers: Sequence[Timer], guard: dict[str, Any], stored: list[Timer]
    ) -> list[Timer]:
        """Each timer (and its payload) in a transaction with ``guard`` (a ConditionCheck),
        only if absent; appends those stored to ``stored`` as they are (what a failure midway
        leaves the caller knowing) and returns it. A keyed create uses it: once its key is
        done, a late attempt writes nothing (the timers may have been changed or deleted)."""
        for timer in timers:
            absent = {"ConditionExpression": "attribute_not_exists(timer_id)"}
            writes = [guard, {"Put": {"TableName": self.table,
                                      "Item": self.item(timer).serialize(), **absent}}]  # fmt: skip
            if (payload := self.payload_item(timer)) is not None:
                writes.append({"Put": {"TableName": self.table, "Item": payload.serialize()}})
            try:
                self.transact(writes)
            except ConcurrentUpdate:  # stored by another attempt, or the key is done
                continue
            stored.append(timer)
        return stored

    def remove_new(self, timers: Sequence[Timer]) -> None:
        """Best effort: delete what a failed batch create may have written - the timers first,
        their payloads only once no timer can be left without its own."""
        try:
            with self.models.timer.batch_write() as batch:
                for timer in timers:
                    batch.delete(self.models.timer(timer.tenant, timer.id))
            with self.models.payload.batch_write() as batch:
                for timer in timers:
                    if self.payload_item(timer) is not None:
                        batch.delete(self.models.payload(timer.tenant, timer.id + PAYLOAD_SUFFIX))
        except Exception:  # what stays is valid, and the caller's retry with its key finds it
            pass

    def create_one(self, timer: Timer) -> None:
        """Create the timer only if absent; raises ConcurrentUpdate if it exists."""
        payload = self.payload_item(timer)
        if payload is not None:
            payload.save()
        try:
            self.item(timer).save(condition=self.models.timer.timer_id.does_not_exist())
        except PutError as exc:
            if failed_because(exc, "ConditionalCheckFailedException"):
                raise ConcurrentUpdate("the timer exists already") from exc
            raise

    def change_writes(self, before: Timer, after: Timer | None) -> list[dict[str, Any]]:
        """TransactWriteItems elements that replace ``before`` (at its revision) with ``after``
        (None: delete it), payload item included."""
        key = {"tenant": {"S": before.tenant}, "timer_id": {"S": before.id}}
        guard = {
            "ConditionExpression": "#rev = :rev",
            "ExpressionAttributeNames": {"#rev": "rev"},
            "ExpressionAttributeValues": {":rev": {"N": str(before.rev)}},
        }
        payload_key = {"tenant": key["tenant"], "timer_id": {"S": before.id + PAYLOAD_SUFFIX}}
        if after is None:
            writes: list[dict[str, Any]] = [
                {"Delete": {"TableName": self.table, "Key": key, **guard}}
            ]
            if _external(before):
                writes.append({"Delete": {"TableName": self.table, "Key": payload_key}})
            return writes
        writes = [{"Put": {"TableName": self.table, "Item": self.item(after).serialize(), **guard}}]
        payload = self.payload_item(after)
        if payload is not None and (
            after.payload_json != before.payload_json or (after.expires_ms != before.expires_ms)
        ):
            writes.append({"Put": {"TableName": self.table, "Item": payload.serialize()}})
        elif payload is None and _external(before):
            writes.append({"Delete": {"TableName": self.table, "Key": payload_key}})
        return writes

    def unchanged_check(self, timer: Timer) -> dict[str, Any]:
        """A TransactWriteItems element: ``timer`` is still stored at its revision."""
        return {
            "ConditionCheck": {
                "TableName": self.table,
                "Key": {"tenant": {"S": timer.tenant}, "timer_id": {"S": timer.id}},
                "ConditionExpression": "#rev = :rev",
                "ExpressionAttributeNames": {"#rev": "rev"},
                "ExpressionAttributeValues": {":rev": {"N": str(timer.rev)}},
            }
        }

    def transact(self, writes: Sequence[dict[str, Any]]) -> None:
        """Run a change transaction; a failed condition becomes ConcurrentUpdate."""
        try:
            self.client.transact_write_items(TransactItems=list(writes))
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "TransactionCanceledException":
                raise ConcurrentUpdate("the timer or its next fire changed; retry") from exc
            raise

    def checkpoint(self, timer: Timer, pos: int | None, n: int, last: int | None) -> bool:
        """Move the checkpoint of ``timer`` (at its revision); False if the timer changed."""
        item = self.models.timer
        actions = [
            item.ckpt_ms.set(pos) if pos is not None else item.ckpt_ms.remove(),
            item.ckpt_n.set(n),
            item.ckpt_pv.set(last) if last is not None else item.ckpt_pv.remove(),
        ]
        return self._update(timer, actions)

    def complete(self, timer: Timer, n: int, last: int | None, expires_ms: int) -> bool:
        """A recurring timer fired its last: completed, without a checkpoint, expiring."""
        item, payload = self.models.timer, self.models.payload
        actions: list[Action] = [
            item.status.set("completed"),
            item.ckpt_ms.remove(),
            item.ckpt_n.set(n),
            item.ckpt_pv.set(last) if last is not None else item.ckpt_pv.remove(),
            item.owed.remove(),
            item.expires_at.set(_at(expires_ms)),
        ]
        if not _external(timer):
            return self._update(timer, actions)
        # One transaction: a change that re-arms the timer meanwhile must not leave its payload
        # item expiring under it.
        try:
            with TransactWrite(connection=item._get_connection().connection) as transaction:
                transaction.update(
                    item(timer.tenant, timer.id), actions=actions, condition=item.rev == timer.rev
                )
                transaction.update(
                    payload(timer.tenant, timer.id + PAYLOAD_SUFFIX),
                    actions=[payload.expires_at.set(_at(expires_ms))],
                )
        except TransactWriteError as exc:
            if failed_because(exc, "TransactionCanceledException"):
                return False
            raise
        return True

    def settle_owed(self, timer: Timer) -> bool:
        """An inactive timer whose owed fire finished owes nothing more (at its revision)."""
        return self._update(timer, [self.models.timer.owed.remove()])

    def _update(self, timer: Timer, actions: list[Any]) -> bool:
        try:
            item = self.models.timer
            item(timer.tenant, timer.id).update(actions=actions, condition=item.rev == timer.rev)
        except UpdateError as exc:
            if failed_because(exc, "ConditionalCheckFailedException"):
                return False
            raise
        return True

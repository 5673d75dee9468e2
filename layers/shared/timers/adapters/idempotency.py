"""DynamoDB ``idempotency`` table (pynamodb): the first response to an Idempotency-Key, 24 h."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import timedelta

from pynamodb.attributes import NumberAttribute, TTLAttribute, UnicodeAttribute
from pynamodb.exceptions import PutError
from pynamodb.models import Model

from timers.adapters.dynamodb import failed_because
from timers.core.times import from_ms

IDEMPOTENCY_TTL = timedelta(hours=24)


class IdempotencyItem(Model):
    class Meta:
        table_name = "idempotency"

    pk = UnicodeAttribute(hash_key=True)
    body_hash = UnicodeAttribute()
    timer_ids = UnicodeAttribute()  # JSON list: the ids the first request chose
    state = UnicodeAttribute()  # pending | done
    response = UnicodeAttribute(null=True)
    created_ms = NumberAttribute()
    expires_at = TTLAttribute()


def bind(table: str) -> None:
    IdempotencyItem.Meta.table_name = table


@dataclass(frozen=True)
class IdempotencyRecord:
    body_hash: str
    timer_ids: list[str]
    response: str | None  # None while the first request is still in flight


class IdempotencyStore:
    def claim(
        self, tenant: str, key: str, body_hash: str, timer_ids: list[str], now_ms: int
    ) -> IdempotencyRecord | None:
        """Record the first use of a key; returns the existing record if the key was used."""
        pk = f"{tenant}|{key}"
        item = IdempotencyItem(
            pk,
            body_hash=body_hash,
            timer_ids=json.dumps(timer_ids),
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
            if not failed_because(exc, "ConditionalCheckFailedException"):
                raise
        existing = IdempotencyItem.get(pk, consistent_read=True)
        return IdempotencyRecord(
            existing.body_hash, json.loads(existing.timer_ids), existing.response
        )

    def complete(self, tenant: str, key: str, response: str) -> None:
        IdempotencyItem(f"{tenant}|{key}").update(
            actions=[IdempotencyItem.state.set("done"), IdempotencyItem.response.set(response)]
        )

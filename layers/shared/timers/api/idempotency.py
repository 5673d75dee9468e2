"""DynamoDB ``idempotency`` table (pynamodb): what the first request with an Idempotency-Key
chose - its body's hash, its timer ids and its clock - for 24 h.

The answer itself is not stored: it is a function of the body (the same, by its hash), the ids
and the clock, so a replay rebuilds it. A stored answer grew with the payloads (four 60 KB ones
outgrew DynamoDB's 400 KB item after the timers existed).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from pynamodb.attributes import NumberAttribute, TTLAttribute, UnicodeAttribute
from pynamodb.exceptions import PutError
from pynamodb.models import Model

from timers.core.times import from_ms
from timers.store.dynamodb import bound_model, failed_because

IDEMPOTENCY_TTL = timedelta(hours=24)


class IdempotencyItem(Model):
    """The schema only: an IdempotencyStore binds it to its table."""

    pk = UnicodeAttribute(hash_key=True)
    body_hash = UnicodeAttribute()
    timer_ids = UnicodeAttribute()  # JSON list: the ids the first request chose
    state = UnicodeAttribute()  # pending | done
    created_ms = NumberAttribute()
    expires_at = TTLAttribute()


@dataclass(frozen=True)
class IdempotencyRecord:
    body_hash: str
    timer_ids: list[str]
    created_ms: int  # the first request's clock: its answer is rebuilt at it
    done: bool  # False while the first request is in flight, or after it died


class IdempotencyStore:
    def __init__(self, table: str) -> None:
        self.model = bound_model(IdempotencyItem, table)

    def claim(
        self, tenant: str, key: str, body_hash: str, timer_ids: list[str], now_ms: int
    ) -> IdempotencyRecord | None:
        """Record the first use of a key; returns the existing record if the key was used."""
        pk = f"{tenant}|{key}"
        item = self.model(
            pk,
            body_hash=body_hash,
            timer_ids=json.dumps(timer_ids),
            state="pending",
            created_ms=now_ms,
            expires_at=from_ms(now_ms) + IDEMPOTENCY_TTL,
        )
        # DynamoDB deletes expired items lazily, so an expired record counts as absent
        fresh = self.model.pk.does_not_exist() | (self.model.expires_at <= from_ms(now_ms))
        try:
            item.save(condition=fresh)
            return None
        except PutError as exc:
            if not failed_because(exc, "ConditionalCheckFailedException"):
                raise
        return self.read(tenant, key, now_ms)

    def read(self, tenant: str, key: str, now_ms: int) -> IdempotencyRecord | None:
        """The key's record, unless it expired (consistent)."""
        try:
            item = self.model.get(f"{tenant}|{key}", consistent_read=True)
        except self.model.DoesNotExist:
            return None
        if item.expires_at <= from_ms(now_ms):
            return None
        done = item.state == "done"
        return IdempotencyRecord(
            item.body_hash, json.loads(item.timer_ids), int(item.created_ms), done
        )

    def guard(self, tenant: str, key: str) -> dict[str, Any]:
        """A TransactWriteItems ConditionCheck: the key's first request is not done (its
        timers are not all stored yet)."""
        return {
            "ConditionCheck": {
                "TableName": self.model.Meta.table_name,
                "Key": {"pk": {"S": f"{tenant}|{key}"}},
                "ConditionExpression": "#state = :pending",
                "ExpressionAttributeNames": {"#state": "state"},
                "ExpressionAttributeValues": {":pending": {"S": "pending"}},
            }
        }

    def complete(self, tenant: str, key: str) -> None:
        self.model(f"{tenant}|{key}").update(actions=[self.model.state.set("done")])

"""DynamoDB ``groups`` table: each tenant's groups - the registry ``GET /v1/groups`` lists, and
where a group operation that stopped at its limit goes on from.

Key ``tenant`` (hash) and ``name`` (range). An item holds when the group was first seen
(``created_ms``), when a timer last joined it (``seen_ms``: a create or a move writes it
*before* the timer, as a wake listing is written first) and, while an operation on it is
unfinished, its progress (``op``, ``op_after``: the last timer id it went through, ``op_ms``).
Which timers are in a group is the timers table's index (never this item: no count to keep, so
a fire or a change of a grouped timer never writes here). An item whose group emptied is
deleted by the next listing that finds it empty and older than a create in flight.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

from timers.store.dynamodb import LowLevelClient, condition_failed


@dataclass(frozen=True)
class GroupRecord:
    tenant: str
    name: str
    created_ms: int
    seen_ms: int
    op: str | None = None  # the action of an unfinished operation
    op_after: str | None = None  # ... the last timer id it went through
    op_ms: int | None = None  # ... when its last call ended


def _n(item: dict[str, Any], name: str) -> int | None:
    value = item.get(name, {})
    return int(value["N"]) if "N" in value else None


def _record(item: dict[str, Any]) -> GroupRecord:
    return GroupRecord(
        tenant=item["tenant"]["S"],
        name=item["name"]["S"],
        created_ms=_n(item, "created_ms") or 0,
        seen_ms=_n(item, "seen_ms") or 0,
        op=item.get("op", {}).get("S"),
        op_after=item.get("op_after", {}).get("S"),
        op_ms=_n(item, "op_ms"),
    )


class GroupStore(LowLevelClient):
    def __init__(self, table: str, client: Any = None) -> None:
        self.table = table
        self._client = client

    def _key(self, tenant: str, name: str) -> dict[str, Any]:
        return {"tenant": {"S": tenant}, "name": {"S": name}}

    def touch(self, tenant: str, names: Iterable[str], now_ms: int) -> None:
        """Timers are about to join these groups: each exists from now (its first sight kept)."""
        for name in sorted(set(names)):
            self.client.update_item(
                TableName=self.table,
                Key=self._key(tenant, name),
                UpdateExpression="SET created_ms = if_not_exists(created_ms, :now), seen_ms = :now",
                ExpressionAttributeValues={":now": {"N": str(now_ms)}},
            )

    def get(self, tenant: str, name: str) -> GroupRecord | None:
        item = self.client.get_item(
            TableName=self.table, Key=self._key(tenant, name), ConsistentRead=True
        ).get("Item")
        return None if item is None else _record(item)

    def page(
        self, tenant: str, after: str | None, limit: int
    ) -> tuple[list[GroupRecord], str | None]:
        """Up to ``limit`` of the tenant's records by name after ``after``; and the name to go
        on after (None: the last)."""
        request: dict[str, Any] = {
            "TableName": self.table,
            "KeyConditionExpression": "tenant = :t" + (" AND #n > :a" if after else ""),
            "ExpressionAttributeValues": {":t": {"S": tenant}},
            "Limit": limit,
            "ConsistentRead": True,
        }
        if after:
            request["ExpressionAttributeNames"] = {"#n": "name"}
            request["ExpressionAttributeValues"][":a"] = {"S": after}
        response = self.client.query(**request)
        records = [_record(i) for i in response.get("Items", [])]
        more = response.get("LastEvaluatedKey")
        return records, (records[-1].name if more and records else None)

    def progress(self, tenant: str, name: str, action: str, after: str, now_ms: int) -> None:
        """An operation stopped at its limit after timer ``after``: the next call goes on."""
        self.client.update_item(
            TableName=self.table,
            Key=self._key(tenant, name),
            UpdateExpression="SET op = :op, op_after = :after, op_ms = :now, "
            "created_ms = if_not_exists(created_ms, :now), seen_ms = if_not_exists(seen_ms, :now)",
            ExpressionAttributeValues={
                ":op": {"S": action},
                ":after": {"S": after},
                ":now": {"N": str(now_ms)},
            },
        )

    def finished(self, tenant: str, name: str) -> None:
        """The operation went through the whole group: the next call starts afresh."""
        try:
            self.client.update_item(
                TableName=self.table,
                Key=self._key(tenant, name),
                UpdateExpression="REMOVE op, op_after, op_ms",
                ConditionExpression="attribute_exists(tenant)",
            )
        except ClientError as exc:
            if not condition_failed(exc):
                raise

    def forget(self, record: GroupRecord) -> bool:
        """Delete the record of a group found empty, unless a timer joined since it was read
        (``seen_ms`` moved); False if one did."""
        try:
            self.client.delete_item(
                TableName=self.table,
                Key=self._key(record.tenant, record.name),
                ConditionExpression="seen_ms = :seen",
                ExpressionAttributeValues={":seen": {"N": str(record.seen_ms)}},
            )
        except ClientError as exc:
            if condition_failed(exc):
                return False
            raise
        return True

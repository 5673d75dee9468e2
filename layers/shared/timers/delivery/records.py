"""An HTTP fire's delivery record: the delivery function's state of one fire (attempts, the
last answer, delivered or failed), in a small item of its own in the claims table,
``w/<partition>/<second>/<entry>``, beside the fire's entry in the fire log.

Named by the root of the entry's path (no locate), a record costs ~1 WRU a write where an
attribute of the fire-log item cost that item's whole size. It expires with the fire log.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from botocore.exceptions import ClientError

from timers.core.webhook_attempts import DeliveryState
from timers.engine.entries import EntryRef
from timers.engine.log import TTL, TTL_MARGIN_S
from timers.store.dynamodb import Fields, LowLevelClient, condition_failed, from_map, to_map

RECORD = "w"  # the attribute that holds the record
FIELDS: Fields = {
    "attempts": ("a", "N"), "first_ms": ("t0", "N"), "last_ms": ("t", "N"),
    "last_status": ("ls", "N"), "last_error": ("le", "S"), "last_body": ("lb", "S"),
    "last_latency_ms": ("ll", "N"), "delivered_ms": ("dv", "N"),
    "failed": ("x", "S"), "failed_ms": ("xt", "N"), "base_attempts": ("a0", "N"),
}  # fmt: skip


def record_key(ref: EntryRef) -> str:
    root = "/".join(ref[0].split("/", 2)[:2])
    return f"w/{root}/{ref[1]}"


class DeliveryRecords(LowLevelClient):
    def __init__(self, table: str, retention_days: int, client: Any = None) -> None:
        self.table = table
        self.retention_days = retention_days
        self._client = client

    def _expires_at(self, ref: EntryRef) -> int:
        return int(ref[0].split("/", 2)[1]) + self.retention_days * 86_400 + TTL_MARGIN_S

    def read_deliveries(self, refs: Iterable[EntryRef]) -> dict[EntryRef, DeliveryState]:
        """The records of these fires (absent ones left out)."""
        keys = {ref: record_key(ref) for ref in refs}
        found: dict[str, Any] = {}
        ordered = sorted(set(keys.values()))
        for start in range(0, len(ordered), 100):
            request = {"Keys": [{"k": {"S": k}} for k in ordered[start : start + 100]]}
            pending: dict[str, Any] = {self.table: request}
            while pending:
                response = self.client.batch_get_item(RequestItems=pending)
                for item in response["Responses"].get(self.table, []):
                    found[item["k"]["S"]] = item
                pending = response.get("UnprocessedKeys") or {}
        return {
            ref: DeliveryState(**from_map(found[key][RECORD], FIELDS))
            for ref, key in keys.items()
            if RECORD in found.get(key, {})
        }

    def read_delivery(self, ref: EntryRef) -> DeliveryState | None:
        """One fire's record (consistent), None before its first attempt."""
        got = self.client.get_item(TableName=self.table, Key={"k": {"S": record_key(ref)}},
                                   ConsistentRead=True).get("Item", {})  # fmt: skip
        return DeliveryState(**from_map(got[RECORD], FIELDS)) if RECORD in got else None

    def write_delivery(
        self, ref: EntryRef, state: DeliveryState, previous: DeliveryState | None
    ) -> bool:
        """Store a record only over the one read before: two copies of a message handled at
        once cannot both count their attempt as the same one."""
        condition, names, values = "attribute_not_exists(#w)", {"#w": RECORD}, {}
        if previous is not None:
            condition, names = "#w.#a = :prev", {"#w": RECORD, "#a": "a"}
            values = {":prev": {"N": str(previous.attempts)}}
        return self._write(
            ref, f"SET #w = :v, {TTL} = if_not_exists({TTL}, :ttl)", condition, names,
            {**values, ":v": to_map(state, FIELDS), ":ttl": {"N": str(self._expires_at(ref))}},
        )  # fmt: skip

    def reopen_delivery(self, ref: EntryRef, state: DeliveryState, failed: DeliveryState) -> bool:
        """A redelivered fire's record (pending again), only over the very failure it reopens."""
        return self._write(
            ref, "SET #w = :v", "#w.#a = :a AND #w.#xt = :xt",
            {"#w": RECORD, "#a": "a", "#xt": "xt"},
            {":v": to_map(state, FIELDS), ":a": {"N": str(failed.attempts)},
             ":xt": {"N": str(failed.failed_ms or 0)}},
        )  # fmt: skip

    def _write(self, ref: EntryRef, update: str, condition: str, names: dict[str, str],
               values: dict[str, Any]) -> bool:  # fmt: skip
        try:
            self.client.update_item(
                TableName=self.table, Key={"k": {"S": record_key(ref)}}, UpdateExpression=update,
                ConditionExpression=condition, ExpressionAttributeNames=names,
                ExpressionAttributeValues=values,
            )  # fmt: skip
        except ClientError as exc:
            if condition_failed(exc):
                return False
            raise
        return True

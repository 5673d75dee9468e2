"""Wake listings (DynamoDB ``wakeups`` table): where the migrator finds timers without Redis
("Data model" and R4 in docs/fire-path.md). Key ``(shard, "<wake ms, 13 digits>#<writer>")``,
shard ``partition % WAKE_SHARDS``: a bucket's listings are the shards ``s % buckets ==
bucket`` (bucket counts divide WAKE_SHARDS), so a bucket is restored from its own shards.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from timers.store.dynamodb import LowLevelClient

WAKE_SHARDS = 64
"""Hash keys of the listings; BucketCount must divide it (each bucket reads 64 / count)."""
MINUTE_MS = 60_000


@dataclass(frozen=True)
class Listing:
    tenant: str
    timer_id: str
    rev: int
    pos: int
    partition: int

    def __str__(self) -> str:
        return f"{self.tenant}|{self.timer_id}|{self.rev}|{self.pos}"


@dataclass(frozen=True)
class WakeItem:
    shard: str
    wake: str
    listings: list[Listing]
    at: int  # when it was written


def shards_of(bucket: int, bucket_count: int) -> list[str]:
    return [str(s) for s in range(bucket, WAKE_SHARDS, bucket_count)]


class WakeStore(LowLevelClient):
    def __init__(self, table: str, retention_days: int, client: Any = None) -> None:
        self.table = table
        self.retention_ms = retention_days * 86_400_000
        self._client = client

    def items(self, listings: Iterable[Listing], now_ms: int) -> list[WakeItem]:
        """The items announcing ``listings``: one per shard and wake minute."""
        groups: dict[tuple[int, int], list[Listing]] = {}
        for listing in listings:
            key = (listing.partition % WAKE_SHARDS, listing.pos // MINUTE_MS)
            groups.setdefault(key, []).append(listing)
        return [
            WakeItem(
                str(shard),
                f"{min(x.pos for x in group):013d}#{secrets.token_hex(6)}",
                group,
                now_ms,
            )
            for (shard, _), group in groups.items()
        ]

    def serialize(self, item: WakeItem) -> dict[str, Any]:
        latest = max(x.pos for x in item.listings)
        return {
            "shard": {"S": item.shard},
            "wake": {"S": item.wake},
            "at": {"N": str(item.at)},
            "members": {"L": [{"S": f"{x.partition}:{x}"} for x in item.listings]},
            "expires_at": {"N": str((max(latest, item.at) + self.retention_ms) // 1000)},
        }

    def put(self, items: Sequence[WakeItem]) -> None:
        self._batch_write([{"PutRequest": {"Item": self.serialize(i)}} for i in items])

    def window(
        self, shard: str, low: int, high: int, limit: int, start: dict[str, Any] | None = None
    ) -> tuple[list[WakeItem], dict[str, Any] | None]:
        """Items of ``shard`` waking in [low, high], in wake order, at most ``limit``; and the
        key to go on from (None: the range ended)."""
        request: dict[str, Any] = {
            "TableName": self.table,
            "Limit": limit,
            "ConsistentRead": True,
            "KeyConditionExpression": "#s = :s AND #w BETWEEN :lo AND :hi",
            "ExpressionAttributeNames": {"#s": "shard", "#w": "wake"},
            "ExpressionAttributeValues": {
                ":s": {"S": shard},
                ":lo": {"S": f"{max(low, 0):013d}"},
                ":hi": {"S": f"{high:013d}#~"},
            },
        }
        if start:
            request["ExclusiveStartKey"] = start
        response = self.client.query(**request)
        return [_item(i) for i in response.get("Items", [])], response.get("LastEvaluatedKey")

    def delete(self, items: Sequence[WakeItem]) -> None:
        """Items whose every listing is dead."""
        keys = [{"shard": {"S": i.shard}, "wake": {"S": i.wake}} for i in items]
        self._batch_write([{"DeleteRequest": {"Key": key}} for key in keys])

    def _batch_write(self, requests: list[dict[str, Any]]) -> None:
        """BatchWriteItem, 25 requests a call; unprocessed ones retried."""
        for start in range(0, len(requests), 25):
            pending: dict[str, Any] = {self.table: requests[start : start + 25]}
            for _ in range(10):
                response = self.client.batch_write_item(RequestItems=pending)
                if not (pending := response.get("UnprocessedItems")):
                    break
            else:
                raise RuntimeError("wake listings: BatchWriteItem kept returning unprocessed items")


def _item(raw: dict[str, Any]) -> WakeItem:
    listings = []
    for member in raw.get("members", {}).get("L", []):
        partition, text = member["S"].split(":", 1)
        tenant, timer_id, rev, pos = text.split("|")
        listings.append(Listing(tenant, timer_id, int(rev), int(pos), int(partition)))
    return WakeItem(
        raw["shard"]["S"], raw["wake"]["S"], listings, int(raw.get("at", {"N": "0"})["N"])
    )

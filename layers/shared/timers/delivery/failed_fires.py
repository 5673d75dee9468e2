"""DynamoDB ``failed fires`` table: one item per failure of an HTTP fire, a tenant's in time order.

Key: ``tenant`` (hash) and ``at`` = ``<failed-at epoch ms, 13 digits>#<fire id>`` (range), so a
tenant's failures list newest first in one Query, a time window is a key range, and a fire that
fails again after a redelivery is a new item. The item keeps the delivery message that failed
(body and attributes), so a redelivery sends exactly that callback again. Items expire with the
fire history (FireRetentionDays after they failed).

The delivery function only puts items (conditionally: the first write of a failure wins, and
writing it again is a no-op); the api reads them and marks them redelivered.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from botocore.exceptions import ClientError

from timers.core.failures import FailedFire, sort_key
from timers.store import aws
from timers.store.dynamodb import LowLevelClient, condition_failed

TTL_ATTRIBUTE = "expires_at"
QUERY_PAGE = 100  # items a Query returns at most per call


class FailedFireStore(LowLevelClient):
    def __init__(self, table: str, retention_days: int, client: Any = None) -> None:
        self.table = table
        self.retention_days = retention_days
        self._client = client

    # ---------------------------------------------------------------- items

    def to_item(self, record: FailedFire) -> dict[str, Any]:
        status = record.last_status
        redelivered = record.redelivered_ms
        return {
            "tenant": {"S": record.tenant},
            "at": {"S": record.at},
            "fire_id": {"S": record.fire_id},
            "timer_id": {"S": record.timer_id},
            "reason": {"S": record.reason},
            "last_status": {"NULL": True} if status is None else {"N": str(status)},
            "attempts": {"N": str(record.attempts)},
            "failed_ms": {"N": str(record.failed_ms)},
            "body": {"S": record.body},
            "attributes": {"M": {k: {"S": v} for k, v in record.attributes.items()}},
            "redelivered_ms": {"NULL": True} if redelivered is None else {"N": str(redelivered)},
            TTL_ATTRIBUTE: {"N": str(record.failed_ms // 1000 + self.retention_days * 86_400)},
        }

    @staticmethod
    def from_item(item: dict[str, Any]) -> FailedFire:
        def number(name: str) -> int | None:
            value = item.get(name, {})
            return int(value["N"]) if "N" in value else None

        return FailedFire(
            tenant=item["tenant"]["S"],
            fire_id=item["fire_id"]["S"],
            timer_id=item["timer_id"]["S"],
            reason=item["reason"]["S"],
            last_status=number("last_status"),
            attempts=number("attempts") or 0,
            failed_ms=number("failed_ms") or 0,
            body=item["body"]["S"],
            attributes={k: v["S"] for k, v in item.get("attributes", {}).get("M", {}).items()},
            redelivered_ms=number("redelivered_ms"),
        )

    # ---------------------------------------------------------------- the delivery function

    def put(self, record: FailedFire) -> None:
        """Record a failure once: a second put of it (a retried delivery, a duplicate message)
        leaves the first, so the item never changes under a redelivery that read it."""
        try:
            self.client.put_item(
                TableName=self.table,
                Item=self.to_item(record),
                ConditionExpression="attribute_not_exists(#at)",
                ExpressionAttributeNames={"#at": "at"},
            )
        except ClientError as exc:
            if not condition_failed(exc):
                raise

    # ---------------------------------------------------------------- the api

    def get(self, tenant: str, failed_ms: int, fire_id: str) -> FailedFire | None:
        got = self.client.get_item(
            TableName=self.table,
            Key={"tenant": {"S": tenant}, "at": {"S": sort_key(failed_ms, fire_id)}},
            ConsistentRead=True,
        )
        item = got.get("Item")
        return None if item is None else self.from_item(item)

    def page(
        self,
        tenant: str,
        low: str,
        high: str,
        limit: int,
        before: str | None,
        include_redelivered: bool = False,
    ) -> tuple[list[FailedFire], str | None]:
        """Up to ``limit`` of a tenant's failures with sort keys in [low, high], newest first,
        from before ``before`` (a sort key); and the sort key to continue before (None: done).
        Redelivered failures are left out unless ``include_redelivered``: a page can then be
        short, even empty, with a key to go on from (a filtered Query reads ``limit`` items)."""
        request: dict[str, Any] = {
            "TableName": self.table,
            "KeyConditionExpression": "tenant = :t AND #at BETWEEN :low AND :high",
            "ExpressionAttributeNames": {"#at": "at"},
            "ExpressionAttributeValues": {
                ":t": {"S": tenant},
                ":low": {"S": low},
                ":high": {"S": high},
            },
            "ScanIndexForward": False,
            "Limit": limit,
        }
        if before is not None:
            request["ExclusiveStartKey"] = {"tenant": {"S": tenant}, "at": {"S": before}}
        if not include_redelivered:
            request["FilterExpression"] = "attribute_type(redelivered_ms, :null)"
            request["ExpressionAttributeValues"][":null"] = {"S": "NULL"}
        got = self.client.query(**request)
        last = got.get("LastEvaluatedKey")
        return [self.from_item(i) for i in got.get("Items", [])], last["at"]["S"] if last else None

    def not_redelivered(self, tenant: str, timer_id: str, read_limit: int) -> Iterator[FailedFire]:
        """A timer's failures not redelivered yet, newest first, among the tenant's newest
        ``read_limit`` failures (a filtered Query reads the others too: this bounds its cost)."""
        request: dict[str, Any] = {
            "TableName": self.table,
            "KeyConditionExpression": "tenant = :t",
            "FilterExpression": "timer_id = :timer AND attribute_type(redelivered_ms, :null)",
            "ExpressionAttributeValues": {
                ":t": {"S": tenant},
                ":timer": {"S": timer_id},
                ":null": {"S": "NULL"},
            },
            "ScanIndexForward": False,
            "Limit": QUERY_PAGE,
        }
        read = 0
        while read < read_limit:
            got = self.client.query(**request)
            read += int(got.get("ScannedCount", QUERY_PAGE))
            yield from (self.from_item(i) for i in got.get("Items", []))
            last = got.get("LastEvaluatedKey")
            if last is None:
                return
            request["ExclusiveStartKey"] = last

    def mark_redelivered(self, record: FailedFire, redelivered_ms: int) -> bool:
        """Set ``redelivered_ms``, only on a failure not redelivered yet (False otherwise)."""
        try:
            self.client.update_item(
                TableName=self.table,
                Key={"tenant": {"S": record.tenant}, "at": {"S": record.at}},
                UpdateExpression="SET redelivered_ms = :now",
                ConditionExpression=(
                    "attribute_exists(#at) AND attribute_type(redelivered_ms, :null)"
                ),
                ExpressionAttributeNames={"#at": "at"},
                ExpressionAttributeValues={
                    ":now": {"N": str(redelivered_ms)},
                    ":null": {"S": "NULL"},
                },
            )
        except ClientError as exc:
            if condition_failed(exc):
                return False
            raise
        return True


class DeliveryQueue:
    """The delivery queue, as the api sends a redelivered fire's message to it."""

    def __init__(self, queue_url: str, client: Any = None) -> None:
        self.queue_url = queue_url
        self._client = client

    def send(self, body: str, attributes: Mapping[str, str]) -> None:
        if self._client is None:  # built on first use, not on the api's cold start
            self._client = aws.client("sqs")
        self._client.send_message(
            QueueUrl=self.queue_url,
            MessageBody=body,
            MessageAttributes={
                name: {"DataType": "String", "StringValue": value}
                for name, value in attributes.items()
                if value
            },
        )

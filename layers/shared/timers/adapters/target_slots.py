"""The per-target concurrency cap: at most ``limit`` POSTs in flight to one origin, across every
delivery sandbox, so one slow endpoint holds a bounded share of the delivery function.

A counter per origin and time window in the claims table (key ``slots/<origin hash>/<window>``,
which no claim key can be: those are ``<partition>/<second>``): acquire is one conditional
``ADD 1`` (only while below the limit), release one ``ADD -1``. A sandbox killed mid-attempt
leaks its slot only until the window ends (WINDOW_S), and an attempt that outlives its window
is not counted in the next one, so the cap holds within a factor of two - a bound, not an exact
semaphore, and no lock to clean up.
"""

from __future__ import annotations

import hashlib
from typing import Any

from botocore.exceptions import ClientError

from timers.adapters.dynamodb import LowLevelClient

WINDOW_S = 30
"""Longer than one attempt (10 s timeout) with room: a window is counted from the first slot."""


class TargetSlots(LowLevelClient):
    def __init__(self, table: str, limit: int, client: Any = None) -> None:
        self.table = table
        self.limit = limit
        self._client = client

    @staticmethod
    def key(origin: str, now_ms: int) -> str:
        digest = hashlib.sha256(origin.encode()).hexdigest()[:20]
        return f"slots/{digest}/{now_ms // 1000 // WINDOW_S}"

    def acquire(self, origin: str, now_ms: int) -> str | None:
        """A slot's key (give it to ``release``), or None when the origin is at its limit."""
        key = self.key(origin, now_ms)
        try:
            self.client.update_item(
                TableName=self.table,
                Key={"k": {"S": key}},
                UpdateExpression="ADD inflight :one SET expires_at = :ttl",
                ConditionExpression="attribute_not_exists(inflight) OR inflight < :limit",
                ExpressionAttributeValues={
                    ":one": {"N": "1"},
                    ":limit": {"N": str(self.limit)},
                    ":ttl": {"N": str(now_ms // 1000 + 2 * WINDOW_S + 3_600)},
                },
            )
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException":
                return None
            raise
        return key

    def release(self, key: str) -> None:
        self.client.update_item(
            TableName=self.table,
            Key={"k": {"S": key}},
            UpdateExpression="ADD inflight :minus",
            ConditionExpression="attribute_exists(inflight)",
            ExpressionAttributeValues={":minus": {"N": "-1"}},
        )

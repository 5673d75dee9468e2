"""The delivery concurrency caps, across every delivery sandbox: at most ``per_origin`` POSTs in
flight for one tenant to one origin, and at most ``per_tenant`` for one tenant to all its
origins together. A tenant saturating an origin (its own, a shared one, or another tenant's
endpoint) uses only its own slots, and one tenant's slow origins - however many subdomains -
hold at most ``per_tenant`` of the delivery function's concurrency.

Each cap is a counter per key and time window in the claims table (``slots/<hash>/<window>``,
which no claim key can be: those are ``<partition>/<second>``): acquire is a conditional
``ADD 1`` (only while below the limit), release an ``ADD -1``. The (tenant, origin) counter is
taken first - it is the one a busy origin fills, so a deferral usually costs one write - then
the tenant's; when the second is full the first is given back. A sandbox killed mid-attempt
leaks its slots only until the window ends (WINDOW_S), and an attempt that outlives its window
is not counted in the next one, so each cap holds within a factor of two - a bound, not an
exact semaphore, and no lock to clean up.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

from botocore.exceptions import ClientError

from timers.adapters.dynamodb import LowLevelClient, condition_failed

log = logging.getLogger(__name__)

WINDOW_S = 30
"""Longer than one attempt (10 s timeout) with room: a window is counted from the first slot."""


class TargetSlots(LowLevelClient):
    def __init__(self, table: str, per_origin: int, per_tenant: int, client: Any = None) -> None:
        self.table = table
        self.per_origin = per_origin
        self.per_tenant = per_tenant
        self._client = client

    @staticmethod
    def key(scope: str, now_ms: int) -> str:
        digest = hashlib.sha256(scope.encode()).hexdigest()[:20]
        return f"slots/{digest}/{now_ms // 1000 // WINDOW_S}"

    @classmethod
    def keys(cls, tenant: str, origin: str, now_ms: int) -> tuple[str, str]:
        """The (tenant, origin) counter's key and the tenant's (a NUL never occurs in either)."""
        return cls.key(f"{tenant}\0{origin}", now_ms), cls.key(f"{tenant}\0", now_ms)

    def acquire(self, tenant: str, origin: str, now_ms: int) -> tuple[str, ...] | None:
        """The slots' keys (give them to ``release``), or None when either cap is reached."""
        pair, whole = self.keys(tenant, origin, now_ms)
        if not self._take(pair, self.per_origin, now_ms):
            return None
        if not self._take(whole, self.per_tenant, now_ms):
            self.release((pair,))
            return None
        return pair, whole

    def release(self, keys: tuple[str, ...]) -> None:
        for key in keys:
            try:
                self.client.update_item(
                    TableName=self.table,
                    Key={"k": {"S": key}},
                    UpdateExpression="ADD inflight :minus",
                    ConditionExpression="attribute_exists(inflight)",
                    ExpressionAttributeValues={":minus": {"N": "-1"}},
                )
            except Exception:  # the window ends it anyway
                log.warning("slot release failed", exc_info=True)

    def _take(self, key: str, limit: int, now_ms: int) -> bool:
        try:
            self.client.update_item(
                TableName=self.table,
                Key={"k": {"S": key}},
                UpdateExpression="ADD inflight :one SET expires_at = :ttl",
                ConditionExpression="attribute_not_exists(inflight) OR inflight < :limit",
                ExpressionAttributeValues={
                    ":one": {"N": "1"},
                    ":limit": {"N": str(limit)},
                    ":ttl": {"N": str(now_ms // 1000 + 2 * WINDOW_S + 3_600)},
                },
            )
        except ClientError as exc:
            if condition_failed(exc):
                return False
            raise
        return True

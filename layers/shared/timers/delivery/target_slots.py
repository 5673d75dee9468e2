"""The delivery concurrency caps, across every delivery sandbox: at most ``per_origin`` POSTs in
flight for one tenant to one origin, and at most ``per_tenant`` for one tenant to all its
origins together. A tenant saturating an origin (its own, a shared one, or another tenant's
endpoint) uses only its own slots, and one tenant's slow origins - however many subdomains -
hold at most ``per_tenant`` of the delivery function's concurrency.

Each cap is a counter per key and time window in the claims table (``slots/<hash>/<window>``,
which no claim key can be: those are ``<partition>/<second>``): acquire is a conditional
``ADD n`` (only while n more fit; a full counter's answer carries its count, so the second try
takes what is left), release an ``ADD -n``. A delivery batch takes the slots its messages to
one origin need in one go and gives them back in one go (4 writes per batch and origin, not 4
per message). The (tenant, origin) counter is taken first - it is the one a busy origin fills,
so a deferral usually costs one write - then the tenant's; what the second cannot take is
given back to the first. A sandbox killed mid-attempt leaks its slots only until the window
ends (WINDOW_S), and an attempt that outlives its window is not counted in the next one, so
each cap holds within a factor of two - a bound, not an exact semaphore, and no lock to clean
up.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

from timers.store.dynamodb import LowLevelClient, condition_failed

log = logging.getLogger(__name__)

WINDOW_S = 30
"""Longer than one attempt (10 s timeout) with room: a window is counted from the first slot."""
TRIES = 3  # a counter others keep changing is taken as full after this many answers


@dataclass(frozen=True)
class Held:
    """Slots taken together: ``count`` of each counter in ``keys``."""

    keys: tuple[str, ...]
    count: int


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

    def acquire(self, tenant: str, origin: str, now_ms: int, want: int = 1) -> Held | None:
        """Up to ``want`` slots of both caps (give them to ``release``), or None when either
        cap is reached."""
        pair, whole = self.keys(tenant, origin, now_ms)
        got = self._take(pair, self.per_origin, want, now_ms)
        kept = self._take(whole, self.per_tenant, got, now_ms) if got else 0
        if kept < got:
            self._give(pair, got - kept)
        return Held((pair, whole), kept) if kept else None

    def release(self, held: Held | None) -> None:
        if held is not None:
            for key in held.keys:
                self._give(key, held.count)

    def _give(self, key: str, count: int) -> None:
        try:
            self.client.update_item(
                TableName=self.table,
                Key={"k": {"S": key}},
                UpdateExpression="ADD inflight :minus",
                ConditionExpression="attribute_exists(inflight)",
                ExpressionAttributeValues={":minus": {"N": str(-count)}},
            )
        except Exception:  # the window ends it anyway
            log.warning("slot release failed", exc_info=True)

    def _take(self, key: str, limit: int, want: int, now_ms: int) -> int:
        """How many of ``want`` slots the counter had room for (now taken)."""
        want = min(want, limit)
        for _ in range(TRIES):
            try:
                self.client.update_item(
                    TableName=self.table,
                    Key={"k": {"S": key}},
                    UpdateExpression="ADD inflight :n SET expires_at = :ttl",
                    ConditionExpression="attribute_not_exists(inflight) OR inflight <= :room",
                    ExpressionAttributeValues={
                        ":n": {"N": str(want)},
                        ":room": {"N": str(limit - want)},
                        ":ttl": {"N": str(now_ms // 1000 + 2 * WINDOW_S + 3_600)},
                    },
                    ReturnValuesOnConditionCheckFailure="ALL_OLD",
                )
            except ClientError as exc:
                if not condition_failed(exc):
                    raise
                item: Any = exc.response.get("Item") or {}
                want = min(want, limit - int(item.get("inflight", {}).get("N", "0")))
                if want <= 0:
                    return 0
                continue
            return want
        return 0

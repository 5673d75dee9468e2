"""DynamoDB ``wakeups`` table (pynamodb): where the migrator finds one-shot timers.

A one-shot is written once and fires once, so its due entry is append-only and batched: one
item per create request and due minute, key ``(shard, "<due ms>#<random>")``, listing the
one-shots as ``"<partition>:<member>"``. The migrator reads each shard in due order from its
watermark (the item at sort key ``"~"``, which sorts after every due time) and moves the
watermark past the items whose one-shots all fired or changed - so fired work is read about
twice and overdue work is read every minute until it fires, however old.
"""

from __future__ import annotations

import secrets
import zlib
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime

from pynamodb.attributes import ListAttribute, TTLAttribute, UnicodeAttribute
from pynamodb.models import Model

from timers.core.chain import Member

WATERMARK = "~"
Placed = tuple[int, Member]  # (partition, member)
MINUTE_MS = 60_000


class WakeupItem(Model):
    class Meta:
        table_name = "wakeups"

    shard = UnicodeAttribute(hash_key=True)
    wake = UnicodeAttribute(range_key=True)  # "<earliest due ms, 13 digits>#<random>", or "~"
    members = ListAttribute(of=UnicodeAttribute, null=True)
    at = UnicodeAttribute(null=True)  # the watermark item: the first wake still to read
    expires_at = TTLAttribute(null=True)


def bind(table: str) -> None:
    WakeupItem.Meta.table_name = table


def wake_key(due_ms: int, suffix: str) -> str:
    return f"{due_ms:013d}#{suffix}"


class WakeupStore:
    def __init__(self, shards: int, retention_days: int) -> None:
        self.shards = shards
        self.retention_ms = retention_days * 86_400_000

    def items(self, placed: Iterable[Placed]) -> list[WakeupItem]:
        """The items announcing (partition, member) pairs: one per due minute, random shards."""
        by_minute: dict[int, list[Placed]] = {}
        for partition, member in placed:
            by_minute.setdefault(member.due // MINUTE_MS, []).append((partition, member))
        items = []
        for group in by_minute.values():
            suffix = secrets.token_hex(6)
            latest = max(m.due for _, m in group)
            items.append(
                WakeupItem(
                    str(zlib.crc32(suffix.encode()) % self.shards),
                    wake_key(min(m.due for _, m in group), suffix),
                    members=[f"{b}:{m}" for b, m in group],
                    expires_at=datetime.fromtimestamp((latest + self.retention_ms) / 1000, tz=UTC),
                )
            )
        return items

    def put(self, items: Sequence[WakeupItem]) -> None:
        if len(items) == 1:
            items[0].save()
            return
        with WakeupItem.batch_write() as batch:
            for item in items:
                batch.save(item)

    def window(
        self, shard: str, after: str | None, until_ms: int, limit: int
    ) -> tuple[list[tuple[str, list[Placed]]], bool]:
        """Items of a shard from ``after`` (a wake key, inclusive) to due ``until_ms``, in due
        order, at most ``limit``; and whether more follow."""
        results = WakeupItem.query(
            shard,
            range_key_condition=WakeupItem.wake.between(after or "0", wake_key(until_ms, "~")),
            limit=limit,
        )
        rows = [(str(i.wake), [_placed(str(m)) for m in i.members or []]) for i in results]
        return rows, results.last_evaluated_key is not None and len(rows) >= limit

    def watermark(self, shard: str) -> str | None:
        try:
            return WakeupItem.get(shard, WATERMARK, consistent_read=True).at
        except WakeupItem.DoesNotExist:
            return None

    def set_watermark(self, shard: str, wake: str) -> None:
        WakeupItem(shard, WATERMARK, at=wake).save()


def _placed(text: str) -> Placed:
    partition, member = text.split(":", 1)
    return int(partition), Member.parse(member)

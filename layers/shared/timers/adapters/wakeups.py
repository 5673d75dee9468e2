"""DynamoDB ``wakeups`` table (pynamodb): where the migrator finds one-shot timers.

A one-shot is written once and fires once, so its due entry is batched and written once: one
item per create request (or change) and due minute, key ``(shard, "<due ms>#<random>")``,
listing the one-shots as ``"<partition>:<member>"``. The migrator reads every item of a shard
that is due within its window - overdue ones every minute until they fire, however old - and
deletes an item once each of its listings is *dead* (docs/fire-path.md, R4), a stable property:
so an item is never needed after it is gone, and fired work is read about twice.
"""

from __future__ import annotations

import secrets
import zlib
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime

from pynamodb.attributes import ListAttribute, TTLAttribute, UnicodeAttribute
from pynamodb.models import Model

from timers.core.chain import Member

Placed = tuple[int, Member]  # (partition, member)
MINUTE_MS = 60_000


class WakeupItem(Model):
    class Meta:
        table_name = "wakeups"

    shard = UnicodeAttribute(hash_key=True)
    wake = UnicodeAttribute(range_key=True)  # "<earliest due ms, 13 digits>#<random>"
    members = ListAttribute(of=UnicodeAttribute, null=True)
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
        self, shard: str, until_ms: int, limit: int
    ) -> tuple[list[tuple[str, list[Placed]]], bool]:
        """The shard's items due by ``until_ms``, in due order, at most ``limit``; and whether
        more follow."""
        results = WakeupItem.query(
            shard,
            range_key_condition=WakeupItem.wake <= wake_key(until_ms, "~"),
            limit=limit,
        )
        rows = [(str(i.wake), [_placed(str(m)) for m in i.members or []]) for i in results]
        return rows, results.last_evaluated_key is not None and len(rows) >= limit

    def delete(self, shard: str, wakes: Sequence[str]) -> None:
        """Items whose every listing is dead."""
        with WakeupItem.batch_write() as batch:
            for wake in wakes:
                batch.delete(WakeupItem(shard, wake))


def _placed(text: str) -> Placed:
    partition, member = text.split(":", 1)
    return int(partition), Member.parse(member)

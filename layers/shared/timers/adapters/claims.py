"""DynamoDB ``claims`` table: one item per bucket and second, one attribute per claimed position.

The item key is ``k = "<bucket>/<second>"``; each entry is a top-level map attribute named
``<timer id>@<ms>`` (see :mod:`timers.core.chain`). A write costs the item's size, so one
conditional ``UpdateItem`` claims a whole chunk of fires and one records it. boto3's low-level
client is used directly: entry names are data, which a pynamodb model cannot express, and the
trigger's hot path is lighter without an ORM.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from botocore.exceptions import ClientError

from timers.adapters.dynamodb import LowLevelClient
from timers.core.chain import Entry, EntryRef
from timers.core.webhooks import DeliveryState

CHUNK = 50
"""Entries per conditional write. DynamoDB allows ~100 (each entry costs two of the 300
operators an expression may hold, ~40 of its 4 KB); moto's expression parser recurses once per
operand and overflows Python's stack near 100, so the local stack stays well below."""

BATCH_GET = 100  # keys per BatchGetItem
TTL_ATTRIBUTE = "expires_at"

_FIELDS = {  # Entry field -> (map key, DynamoDB type)
    "state": ("s", "S"),
    "rev": ("r", "N"),
    "n": ("n", "N"),
    "pv": ("pv", "N"),
    "owner": ("o", "S"),
    "until": ("u", "N"),
    "enqueued": ("q", "N"),
    "reason": ("x", "S"),
    "fired": ("f", "N"),
    "next": ("nx", "N"),
    "end": ("e", "BOOL"),
    "hook": ("h", "BOOL"),
}
_NAMES = {f"#{key}": key for key, _ in _FIELDS.values()}


Fields = Mapping[str, tuple[str, str]]  # dataclass field -> (map key, DynamoDB type)


def _to_map(record: Any, fields: Fields) -> dict[str, Any]:
    """A dataclass as a DynamoDB map value; absent fields (None, False) left out."""
    out: dict[str, Any] = {}
    for name, (key, kind) in fields.items():
        value = getattr(record, name)
        if value is None or (kind == "BOOL" and not value):
            continue
        out[key] = {kind: value if kind in ("S", "BOOL") else str(value)}
    return {"M": out}


def _from_map(value: Mapping[str, Any], fields: Fields) -> dict[str, Any]:
    """The keyword arguments of the dataclass a map value holds."""
    stored = value["M"]
    return {
        name: int(stored[key][kind]) if kind == "N" else stored[key][kind]
        for name, (key, kind) in fields.items()
        if key in stored
    }


def to_item_value(entry: Entry) -> dict[str, Any]:
    return _to_map(entry, _FIELDS)


def from_item_value(value: Mapping[str, Any]) -> Entry:
    return Entry(**_from_map(value, _FIELDS))


_DELIVERY_FIELDS = {  # DeliveryState field -> (map key, DynamoDB type)
    "attempts": ("a", "N"),
    "first_ms": ("t0", "N"),
    "last_ms": ("t", "N"),
    "last_status": ("ls", "N"),
    "last_error": ("le", "S"),
    "delivered_ms": ("dv", "N"),
    "failed": ("x", "S"),
}


def delivery_name(entry_name: str) -> str:
    """The delivery record of an HTTP fire sits beside its entry, in an attribute of its own:
    the trigger rewrites whole entries, and never this one (docs/webhooks.md)."""
    return f"w:{entry_name}"


def delivery_to_item_value(state: DeliveryState) -> dict[str, Any]:
    return _to_map(state, _DELIVERY_FIELDS)


def delivery_from_item_value(value: Mapping[str, Any]) -> DeliveryState:
    return DeliveryState(**_from_map(value, _DELIVERY_FIELDS))


class ClaimStore(LowLevelClient):
    def __init__(
        self, table: str, retention_days: int, client: Any = None, record_client: Any = None
    ) -> None:
        self.table = table
        self.retention_days = retention_days
        self._client = client
        # Records may wait longer than claims: a record lost after its send is a duplicate.
        self._record_client = record_client

    def expires_at(self, key: str) -> int:
        """TTL of a claim item (epoch seconds): its second plus the retention."""
        second = int(key.split("/", 1)[1])
        return second + self.retention_days * 86_400

    # ---------------------------------------------------------------- reads

    def read(
        self, refs: Iterable[EntryRef], consistent: bool = False
    ) -> dict[EntryRef, Entry | None]:
        """The entries named (None where absent), in batches of BATCH_GET items."""
        wanted: dict[str, set[str]] = {}
        for key, name in refs:
            wanted.setdefault(key, set()).add(name)
        found: dict[EntryRef, Entry | None] = {
            (key, name): None for key, names in wanted.items() for name in names
        }
        keys = sorted(wanted)
        for start in range(0, len(keys), BATCH_GET):
            chunk = keys[start : start + BATCH_GET]
            names = sorted({n for key in chunk for n in wanted[key]})
            request: dict[str, Any] = {
                "Keys": [{"k": {"S": key}} for key in chunk],
                "ConsistentRead": consistent,
                "ProjectionExpression": ", ".join(["k", *(f"#p{i}" for i in range(len(names)))]),
                "ExpressionAttributeNames": {f"#p{i}": n for i, n in enumerate(names)},
            }
            for item in self._batch_get(request):
                key = item["k"]["S"]
                for name in wanted.get(key, ()):
                    if name in item:
                        found[(key, name)] = from_item_value(item[name])
        return found

    def read_deliveries(self, refs: Iterable[EntryRef]) -> dict[EntryRef, DeliveryState]:
        """The delivery records of these positions' HTTP fires (absent ones left out)."""
        wanted: dict[str, set[str]] = {}
        for key, name in refs:
            wanted.setdefault(key, set()).add(delivery_name(name))
        found: dict[EntryRef, DeliveryState] = {}
        keys = sorted(wanted)
        for start in range(0, len(keys), BATCH_GET):
            chunk = keys[start : start + BATCH_GET]
            names = sorted({n for key in chunk for n in wanted[key]})
            request: dict[str, Any] = {
                "Keys": [{"k": {"S": key}} for key in chunk],
                "ProjectionExpression": ", ".join(["k", *(f"#p{i}" for i in range(len(names)))]),
                "ExpressionAttributeNames": {f"#p{i}": n for i, n in enumerate(names)},
            }
            for item in self._batch_get(request):
                key = item["k"]["S"]
                for name in wanted.get(key, ()):
                    if name in item:
                        found[(key, name[2:])] = delivery_from_item_value(item[name])
        return found

    def read_delivery(self, ref: EntryRef) -> DeliveryState | None:
        """One fire's delivery record (consistent), None before its first attempt."""
        key, name = ref
        response = self.client.get_item(
            TableName=self.table,
            Key={"k": {"S": key}},
            ConsistentRead=True,
            ProjectionExpression="#w",
            ExpressionAttributeNames={"#w": delivery_name(name)},
        )
        value = response.get("Item", {}).get(delivery_name(name))
        return None if value is None else delivery_from_item_value(value)

    def write_delivery(
        self, ref: EntryRef, state: DeliveryState, previous: DeliveryState | None
    ) -> bool:
        """Store a delivery record, only over the one read before (``previous``): two copies
        of a message handled at once cannot both count their attempt as the same one."""
        key, name = ref
        if previous is None:
            condition = "attribute_not_exists(#w)"
            values: dict[str, Any] = {}
        else:
            condition = "#w.#a = :prev"
            values = {":prev": {"N": str(previous.attempts)}}
        try:
            self.client.update_item(
                TableName=self.table,
                Key={"k": {"S": key}},
                UpdateExpression=(
                    f"SET #w = :v, {TTL_ATTRIBUTE} = if_not_exists({TTL_ATTRIBUTE}, :ttl)"
                ),
                ConditionExpression=condition,
                ExpressionAttributeNames={
                    "#w": delivery_name(name),
                    **({"#a": "a"} if previous is not None else {}),
                },
                ExpressionAttributeValues={
                    **values,
                    ":v": delivery_to_item_value(state),
                    ":ttl": {"N": str(self.expires_at(key))},
                },
            )
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException":
                return False
            raise
        return True

    def _batch_get(self, request: dict[str, Any]) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        pending: dict[str, Any] = {self.table: request}
        for _ in range(10):
            response = self.client.batch_get_item(RequestItems=pending)
            items += response["Responses"].get(self.table, [])
            pending = response.get("UnprocessedKeys") or {}
            if not pending:
                return items
        raise RuntimeError("claims: BatchGetItem kept returning unprocessed keys")

    # ---------------------------------------------------------------- writes

    def claim(self, key: str, entries: Mapping[str, Entry]) -> bool:
        """Write every entry in one conditional write, if none of them exists yet."""
        names = list(entries)
        return self._update(
            key,
            "SET "
            + ", ".join(f"#e{i} = :v{i}" for i in range(len(names)))
            + f", {TTL_ATTRIBUTE} = if_not_exists({TTL_ATTRIBUTE}, :ttl)",
            " AND ".join(f"attribute_not_exists(#e{i})" for i in range(len(names))),
            names,
            {
                **{f":v{i}": to_item_value(entries[n]) for i, n in enumerate(names)},
                ":ttl": {"N": str(self.expires_at(key))},
            },
        )

    def take_over(self, key: str, name: str, entry: Entry, old: Entry) -> bool:
        """Replace a tombstone of an older revision, or a lapsed pending claim, with ``entry``
        - only if the entry is still exactly what was read."""
        if old.state == "t":
            condition = "#e0.#s = :os AND #e0.#r = :orev"
            values = {":os": {"S": "t"}, ":orev": {"N": str(old.rev)}}
        else:
            condition = "#e0.#s = :os AND #e0.#o = :oo AND #e0.#u = :ou"
            values = {
                ":os": {"S": "p"},
                ":oo": {"S": old.owner or ""},
                ":ou": {"N": str(old.until or 0)},
            }
        return self._update(
            key,
            f"SET #e0 = :v0, {TTL_ATTRIBUTE} = if_not_exists({TTL_ATTRIBUTE}, :ttl)",
            condition,
            [name],
            {**values, ":v0": to_item_value(entry), ":ttl": {"N": str(self.expires_at(key))}},
            nested=True,
        )

    def record(self, key: str, owner: str, entries: Mapping[str, Entry]) -> bool:
        """Replace claimed entries by their outcomes (sent, failed), only while every one is
        still ``owner``'s. Whole entries, not their fields: one operand per entry is cheaper
        to evaluate (moto takes ~10x longer over nested SET/REMOVE paths)."""
        names = list(entries)
        return self._update(
            key,
            "SET " + ", ".join(f"#e{i} = :v{i}" for i in range(len(names))),
            " AND ".join(f"#e{i}.#o = :own" for i in range(len(names))),
            names,
            {
                ":own": {"S": owner},
                **{f":v{i}": to_item_value(entries[n]) for i, n in enumerate(names)},
            },
            nested=True,
            client=self._record_client,
        )

    def unclaim(self, key: str, owner: str, names: Sequence[str]) -> bool:
        """Remove pending entries that are still ``owner``'s (work the run hands back)."""
        return self._update(
            key,
            "REMOVE " + ", ".join(f"#e{i}" for i in range(len(names))),
            " AND ".join(f"#e{i}.#o = :own" for i in range(len(names))),
            list(names),
            {":own": {"S": owner}},
            nested=True,
        )

    def tombstone_update(self, ref: EntryRef, entry: Entry, now_ms: int) -> dict[str, Any]:
        """A TransactWriteItems ``Update`` that puts a tombstone on a position - only if the
        position has no claim (absent, a tombstone, or a pending claim that lapsed)."""
        key, name = ref
        return {
            "Update": {
                "TableName": self.table,
                "Key": {"k": {"S": key}},
                "UpdateExpression": (
                    f"SET #e0 = :v0, {TTL_ATTRIBUTE} = if_not_exists({TTL_ATTRIBUTE}, :ttl)"
                ),
                "ConditionExpression": (
                    "attribute_not_exists(#e0) OR #e0.#s = :t OR (#e0.#s = :p AND #e0.#u < :lapsed)"
                ),
                "ExpressionAttributeNames": {"#e0": name, "#s": "s", "#u": "u"},
                "ExpressionAttributeValues": {
                    ":v0": to_item_value(entry),
                    ":ttl": {"N": str(self.expires_at(key))},
                    ":t": {"S": "t"},
                    ":p": {"S": "p"},
                    ":lapsed": {"N": str(now_ms - _lapse_margin())},
                },
            }
        }

    def _update(
        self,
        key: str,
        update: str,
        condition: str,
        names: Sequence[str],
        values: Mapping[str, Any],
        nested: bool = False,
        client: Any = None,
    ) -> bool:
        attribute_names = {f"#e{i}": name for i, name in enumerate(names)}
        if nested:
            used = set(re.findall(r"#\w+", update + " " + condition))
            attribute_names.update({k: v for k, v in _NAMES.items() if k in used})
        try:
            (client or self.client).update_item(
                TableName=self.table,
                Key={"k": {"S": key}},
                UpdateExpression=update,
                ConditionExpression=condition,
                ExpressionAttributeNames=attribute_names,
                ExpressionAttributeValues=dict(values),
            )
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException":
                return False
            raise
        return True


def _lapse_margin() -> int:
    from timers.core.chain import LAPSE_MARGIN_MS

    return LAPSE_MARGIN_MS


def chunks(entries: Mapping[str, Any], size: int = CHUNK) -> list[dict[str, Any]]:
    """Split a claim item's entries into writes of at most ``size``."""
    names = list(entries)
    return [{n: entries[n] for n in names[i : i + size]} for i in range(0, len(names), size)]


Reader = Callable[[Sequence[EntryRef]], Mapping[EntryRef, Entry | None]]

"""DynamoDB ``claims`` table: claim items of a partition and second, one attribute per position.

The item key is ``k = "<partition>/<second>"``; each entry is a top-level map attribute named
``<timer id>@<ms>`` (see :mod:`timers.core.chain`). A write costs the item's size, so one
conditional ``UpdateItem`` claims a whole chunk of fires and one records it. boto3's low-level
client is used directly: entry names are data, which a pynamodb model cannot express, and the
trigger's hot path is lighter without an ORM.

**Items stay small** (docs/fire-path.md, "Claim items stay small"). An item takes a new
attribute only while it is unsealed and holds fewer than ``cap`` of them (counter ``c``); a
claim that does not fit seals it (``sl``) for good, and the positions it lacks go to a child
item, ``<key>/<digit>``, the digit taken from the timer's hash at that depth. An entry's *home*
is the first item on its path that holds it or is unsealed: sealed items never gain entries,
so a home never moves and an entry never exists twice. Writes that only change an existing
entry (record, takeover, adoption, release) are allowed in sealed items.

**Entries only move forward** (R1): nothing here removes an entry. A run that gives work back
releases its claims (valid until 0: the next run takes them over at once); a record is
conditional on its owner and on the revision it knows, and merges a change's adoption.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from botocore.exceptions import ClientError

from timers.adapters.dynamodb import LowLevelClient, condition_failed
from timers.core.chain import Entry, EntryRef
from timers.core.errors import ConcurrentUpdate
from timers.core.webhooks import DeliveryState

CHUNK = 50
"""Entries per conditional write. DynamoDB allows ~100 (each entry costs two of the 300
operators an expression may hold, ~40 of its 4 KB); moto's expression parser recurses once per
operand and overflows Python's stack near 100, so the local stack stays well below."""

CLAIM_CAP = 256
"""Attributes an item takes before it is sealed: ~20 KB of entries (an entry is ~75 bytes; an
HTTP fire's delivery record is an item of its own), far below DynamoDB's 400 KB item limit,
and small enough that a write into a full item (a write costs the item's size) stays ~20 WRU."""

MAX_DEPTH = 16  # hex digits of the timer hash: 16^16 items per second and partition
BATCH_GET = 100  # keys per BatchGetItem
TTL_ATTRIBUTE = "expires_at"
TTL_MARGIN_S = 86_400
"""Claim items outlive the timers they belong to by a day: a timer (whose reads hide it once it
expired) never shows a fire count its claim entries no longer back."""
SEALED, COUNT = "sl", "c"
SEALED_KNOWN = 1_024
"""Sealed items whose entry names a store remembers (~20 KB each at most): enough for the hot
seconds of a run; the memory is dropped whole when it fills (it only saves reads)."""

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
_NAME = re.compile(r"#\w+")


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
    "failed_ms": ("xt", "N"),
}


DELIVERY = "w"  # the attribute of a delivery record's item that holds the record


def delivery_key(ref: EntryRef) -> str:
    """The item of an HTTP fire's delivery record: its own small item (``w/<partition>/<second>/
    <entry>``, which no claim or slot key can be), named by the position - the root of the
    entry's path, whichever item the entry lives in - so a reader needs no locate. A write costs
    ~1 WRU, where an attribute of the claim item cost its whole size (~4 WRU for 32 fires)."""
    root = "/".join(ref[0].split("/", 2)[:2])
    return f"w/{root}/{ref[1]}"


def delivery_to_item_value(state: DeliveryState) -> dict[str, Any]:
    return _to_map(state, _DELIVERY_FIELDS)


def delivery_from_item_value(value: Mapping[str, Any]) -> DeliveryState:
    return DeliveryState(**_from_map(value, _DELIVERY_FIELDS))


def child_key(key: str, entry_name: str) -> str:
    """The item below ``key`` on the path of the entry's timer."""
    depth = key.count("/") - 1
    if depth >= MAX_DEPTH:
        raise RuntimeError(f"claims: no room left on the path of {entry_name} at {key}")
    timer_id = entry_name.split("@", 1)[0]
    return f"{key}/{hashlib.blake2b(timer_id.encode(), digest_size=8).hexdigest()[depth]}"


@dataclass(frozen=True)
class Located:
    """Where an entry lives: its home item and what it holds there (None: absent, and then
    ``count`` is how many attributes the home has taken: room is ``cap - count``)."""

    key: str
    entry: Entry | None
    count: int = 0

    def ref(self, name: str) -> EntryRef:
        return self.key, name


class ClaimStore(LowLevelClient):
    def __init__(
        self,
        table: str,
        retention_days: int,
        client: Any = None,
        record_client: Any = None,
        cap: int = CLAIM_CAP,
    ) -> None:
        self.table = table
        self.retention_days = retention_days
        self._client = client
        # Records may wait longer than claims: a record lost after its send is a duplicate.
        self._record_client = record_client
        self.cap = cap
        # Sealed item -> the names it holds, for good: a sealed item never gains an entry.
        self._sealed: dict[str, frozenset[str]] = {}

    def expires_at(self, key: str) -> int:
        """TTL of a claim item (epoch seconds): its second plus the retention and a margin."""
        second = int(key.split("/", 2)[1])
        return second + self.retention_days * 86_400 + TTL_MARGIN_S

    # ---------------------------------------------------------------- reads

    def home_guess(self, ref: EntryRef, now_ms: int) -> str:
        """Where a new entry goes, as far as this store knows: below each item known to be
        sealed without it. Only a guess for a claim, whose condition (unsealed, entry absent)
        makes a wrong one fail; a sealed item's names never change, so what it lacked once
        it lacks for good, and the home is below it - until the item may have expired."""
        key, name = ref
        while (names := self._sealed.get(key)) is not None and name not in names:
            if now_ms >= self.expires_at(key) * 1000:  # TTL may have deleted it: start over
                break
            key = child_key(key, name)
        return key

    def locate(
        self, refs: Iterable[EntryRef], consistent: bool = False, learn: bool = False
    ) -> dict[EntryRef, Located]:
        """Each entry's home, from the item its ref names (the root of its path) down through
        sealed items that lack it. ``learn``: remember every entry name of the sealed items
        passed (one more read each, once), for :meth:`home_guess`."""
        looking = {ref: ref[0] for ref in refs}
        passed: set[str] = set()
        found: dict[EntryRef, Located] = {}
        for _ in range(MAX_DEPTH + 1):
            if not looking:
                break
            wanted: dict[str, set[str]] = {}
            for (_, name), key in looking.items():
                wanted.setdefault(key, set()).add(name)
            items = self._items(wanted, consistent, (SEALED, COUNT))
            deeper: dict[EntryRef, str] = {}
            for ref, key in looking.items():
                item = items.get(key, {})
                name = ref[1]
                if name in item:
                    found[ref] = Located(key, from_item_value(item[name]))
                elif SEALED in item:
                    deeper[ref] = child_key(key, name)
                    passed.add(key)
                else:
                    count = int(item[COUNT]["N"]) if COUNT in item else 0
                    found[ref] = Located(key, None, count)
            looking = deeper
        if learn and (new := passed - self._sealed.keys()):
            self._learn_sealed(new)
        return found

    def _learn_sealed(self, keys: set[str]) -> None:
        """Read sealed items whole: any version of an item that shows the seal holds every
        name it will ever hold (no write adds one to a sealed item)."""
        if len(self._sealed) + len(keys) > SEALED_KNOWN:
            self._sealed.clear()
        for key, item in self._items(dict.fromkeys(keys, None), consistent=False).items():
            if SEALED in item:
                self._sealed[key] = frozenset(n for n in item if "@" in n)

    def read(
        self, refs: Iterable[EntryRef], consistent: bool = False
    ) -> dict[EntryRef, Entry | None]:
        """The entries named (None where absent), wherever on their paths they live."""
        return {ref: at.entry for ref, at in self.locate(refs, consistent).items()}

    def read_deliveries(self, refs: Iterable[EntryRef]) -> dict[EntryRef, DeliveryState]:
        """The delivery records of these positions' HTTP fires (absent ones left out)."""
        homes = {ref: delivery_key(ref) for ref in refs}
        items = self._items({key: {DELIVERY} for key in homes.values()}, consistent=False)
        found: dict[EntryRef, DeliveryState] = {}
        for ref, key in homes.items():
            value = items.get(key, {}).get(DELIVERY)
            if value is not None:
                found[ref] = delivery_from_item_value(value)
        return found

    def read_delivery(self, ref: EntryRef) -> DeliveryState | None:
        """One fire's delivery record (consistent), None before its first attempt. ``ref``
        names the entry's home (the trigger sends it with the fire)."""
        value = self._attribute(delivery_key(ref), DELIVERY)
        return None if value is None else delivery_from_item_value(value)

    def write_delivery(
        self, ref: EntryRef, state: DeliveryState, previous: DeliveryState | None
    ) -> bool:
        """Store a delivery record, only over the one read before (``previous``): two copies
        of a message handled at once cannot both count their attempt as the same one. Its room
        expires with the claim item it sits beside."""
        if previous is None:
            condition = "attribute_not_exists(#w)"
            values: dict[str, Any] = {}
        else:
            condition = "#w.#a = :prev"
            values = {":prev": {"N": str(previous.attempts)}}
        return self._write(
            delivery_key(ref),
            f"SET #w = :v, {TTL_ATTRIBUTE} = if_not_exists({TTL_ATTRIBUTE}, :ttl)",
            condition,
            {"#w": DELIVERY, **({"#a": "a"} if previous is not None else {})},
            {
                **values,
                ":v": delivery_to_item_value(state),
                ":ttl": {"N": str(self.expires_at(ref[0]))},
            },
        )

    def reopen_delivery(self, ref: EntryRef, state: DeliveryState, failed: DeliveryState) -> bool:
        """Store a redelivered fire's record (``state``: pending again), only over the very
        failure it reopens - the same attempts and failed-at time: a delivery function that
        reopened it first (the message got there before this write), or a newer attempt,
        stands."""
        return self._write(
            delivery_key(ref),
            "SET #w = :v",
            "#w.#a = :a AND #w.#xt = :xt",
            {"#w": DELIVERY, "#a": "a", "#xt": "xt"},
            {
                ":v": delivery_to_item_value(state),
                ":a": {"N": str(failed.attempts)},
                ":xt": {"N": str(failed.failed_ms or 0)},
            },
        )

    def _items(
        self, wanted: Mapping[str, set[str] | None], consistent: bool, extra: Sequence[str] = ()
    ) -> dict[str, dict[str, Any]]:
        """The named attributes of each item (all of them where ``wanted`` names None), by
        BatchGetItem, BATCH_GET keys a call."""
        keys = sorted(wanted)
        out: dict[str, dict[str, Any]] = {}
        for start in range(0, len(keys), BATCH_GET):
            chunk = keys[start : start + BATCH_GET]
            request: dict[str, Any] = {
                "Keys": [{"k": {"S": key}} for key in chunk],
                "ConsistentRead": consistent,
            }
            if all(wanted[key] is not None for key in chunk):
                names = sorted({n for key in chunk for n in wanted[key] or ()} | set(extra))
                request["ProjectionExpression"] = ", ".join(
                    ["k", *(f"#p{i}" for i in range(len(names)))]
                )
                request["ExpressionAttributeNames"] = {f"#p{i}": n for i, n in enumerate(names)}
            for item in self._batch_get(request):
                out[item["k"]["S"]] = item
        return out

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

    # ---------------------------------------------------------------- the trigger's writes

    def claim(self, key: str, entries: Mapping[str, Entry]) -> bool:
        """Write every entry in one conditional write, if none of them exists in ``key`` yet
        and the item, unsealed, has room for them. False: one exists, or no room (the caller
        locates them and seals a full item)."""
        names = list(entries)
        adding = len(entries)
        if adding > self.cap:
            raise ValueError(f"{adding} attributes do not fit a claim item of {self.cap}")
        return self._update(
            key,
            "SET "
            + ", ".join(f"#e{i} = :v{i}" for i in range(len(names)))
            + f", {TTL_ATTRIBUTE} = if_not_exists({TTL_ATTRIBUTE}, :ttl)"
            + ", #c = if_not_exists(#c, :zero) + :k",
            "attribute_not_exists(#sl) AND (attribute_not_exists(#c) OR #c <= :room) AND "
            + " AND ".join(f"attribute_not_exists(#e{i})" for i in range(len(names))),
            names,
            {
                **{f":v{i}": to_item_value(entries[n]) for i, n in enumerate(names)},
                ":ttl": {"N": str(self.expires_at(key))},
                ":zero": {"N": "0"},
                ":k": {"N": str(adding)},
                ":room": {"N": str(self.cap - adding)},
            },
            extra_names={"#sl": SEALED, "#c": COUNT},
        )

    def seal(self, key: str) -> None:
        """No new attribute enters ``key`` from now on; its positions' homes are below it."""
        self.client.update_item(
            TableName=self.table,
            Key={"k": {"S": key}},
            UpdateExpression=(
                f"SET #sl = :yes, {TTL_ATTRIBUTE} = if_not_exists({TTL_ATTRIBUTE}, :ttl)"
            ),
            ExpressionAttributeNames={"#sl": SEALED},
            ExpressionAttributeValues={
                ":yes": {"BOOL": True},
                ":ttl": {"N": str(self.expires_at(key))},
            },
        )

    def take_over(self, key: str, name: str, entry: Entry, old: Entry) -> bool:
        """Replace a fence of an older revision (a fresh claim), or a lapsed pending claim (a
        takeover, keeping its decision), with ``entry`` - only if it is still exactly as read."""
        if old.state == "t":
            condition = "#e0.#s = :os AND #e0.#r = :orev"
            values = {":os": {"S": "t"}, ":orev": {"N": str(old.rev)}}
        else:
            condition = "#e0.#s = :os AND #e0.#o = :oo AND #e0.#u = :ou AND #e0.#r = :orev"
            values = {
                ":os": {"S": "p"},
                ":oo": {"S": old.owner or ""},
                ":ou": {"N": str(old.until or 0)},
                ":orev": {"N": str(old.rev)},
            }
        return self._update(
            key,
            "SET #e0 = :v0",
            condition,
            [name],
            {**values, ":v0": to_item_value(entry)},
            nested=True,
        )

    def record(self, key: str, owner: str, entries: Mapping[str, Entry]) -> bool:
        """Replace ``owner``'s claimed entries by their outcomes (sent, failed; or, to give
        them back, pending and lapsed) - only while each is still ``owner``'s at the revision
        given (a change may have adopted it: :meth:`rewrite` merges). Whole entries, not their
        fields: one operand per entry is cheaper to evaluate (moto takes ~10x longer over
        nested SET/REMOVE paths)."""
        names = list(entries)
        return self._update(
            key,
            "SET " + ", ".join(f"#e{i} = :v{i}" for i in range(len(names))),
            " AND ".join(f"#e{i}.#o = :own AND #e{i}.#r = :r{i}" for i in range(len(names))),
            names,
            {
                ":own": {"S": owner},
                **{f":v{i}": to_item_value(entries[n]) for i, n in enumerate(names)},
                **{f":r{i}": {"N": str(entries[n].rev)} for i, n in enumerate(names)},
            },
            nested=True,
            client=self._record_client,
        )

    def rewrite(self, key: str, name: str, owner: str, mine: Entry, tries: int = 3) -> Entry | None:
        """One entry recorded like :meth:`record`, taking a change's adoption into account:
        the revision and successor stored win over ours. None if the entry is no longer
        ``owner``'s (its claim lapsed and another run took it over)."""
        for _ in range(tries):
            stored = self.read_one((key, name))
            if stored is None or stored.state != "p" or stored.owner != owner:
                return None
            merged = replace(mine, rev=stored.rev, next=stored.next, end=stored.end)
            if self.record(key, owner, {name: merged}):
                return merged
        return None

    def read_one(self, ref: EntryRef) -> Entry | None:
        """The entry at this very item (consistent): for the owner of a claim, who knows its
        home."""
        value = self._attribute(*ref)
        return None if value is None else from_item_value(value)

    def _attribute(self, key: str, name: str) -> Any:
        """One attribute of one item, read consistently (None if absent)."""
        response = self.client.get_item(
            TableName=self.table,
            Key={"k": {"S": key}},
            ConsistentRead=True,
            ProjectionExpression="#a",
            ExpressionAttributeNames={"#a": name},
        )
        return response.get("Item", {}).get(name)

    # ---------------------------------------------------------------- a change's writes

    def fence_update(self, ref: EntryRef, fence: Entry) -> dict[str, Any]:
        """A TransactWriteItems ``Update`` putting ``fence`` on an unclaimed position (absent,
        or a fence): the change is ordered before any claim of it (R5). Raises ConcurrentUpdate
        if the position was claimed since the caller's walk."""
        at = self.locate([ref], consistent=True)[ref]
        if at.entry is None and at.count >= self.cap:
            self.seal(at.key)
            at = self.locate([ref], consistent=True)[ref]
        if at.entry is not None and at.entry.state != "t":
            raise ConcurrentUpdate("the timer's next fire was claimed; retry")
        name = ref[1]
        return self._transact_update(
            at.key,
            f"SET #e0 = :v0, {TTL_ATTRIBUTE} = if_not_exists({TTL_ATTRIBUTE}, :ttl), "
            "#c = if_not_exists(#c, :zero) + :one",
            "(attribute_not_exists(#e0) AND attribute_not_exists(#sl) AND "
            "(attribute_not_exists(#c) OR #c <= :room)) OR #e0.#s = :t",
            {"#e0": name, "#s": "s", "#sl": SEALED, "#c": COUNT},
            {
                ":v0": to_item_value(fence),
                ":ttl": {"N": str(self.expires_at(at.key))},
                ":zero": {"N": "0"},
                ":one": {"N": "1"},
                ":room": {"N": str(self.cap - 1)},
                ":t": {"S": "t"},
            },
        )

    def adopt_update(self, ref: EntryRef, adopted: Entry, old: Entry) -> dict[str, Any]:
        """A TransactWriteItems ``Update`` handing a pending claim to the change's revision
        (R5): the owed fire is still sent, and its successor is the change's. Only if the claim
        is still exactly as read (same owner, validity and revision)."""
        at = self.locate([ref], consistent=True)[ref]
        if at.entry != old:
            raise ConcurrentUpdate("the timer's pending fire moved on; retry")
        return self._transact_update(
            at.key,
            "SET #e0 = :v0",
            "#e0.#s = :p AND #e0.#o = :o AND #e0.#u = :u AND #e0.#r = :r",
            {"#e0": ref[1], "#s": "s", "#o": "o", "#u": "u", "#r": "r"},
            {
                ":v0": to_item_value(adopted),
                ":p": {"S": "p"},
                ":o": {"S": old.owner or ""},
                ":u": {"N": str(old.until or 0)},
                ":r": {"N": str(old.rev)},
            },
        )

    def _transact_update(
        self, key: str, update: str, condition: str, names: dict[str, str], values: dict[str, Any]
    ) -> dict[str, Any]:
        return {
            "Update": {
                "TableName": self.table,
                "Key": {"k": {"S": key}},
                "UpdateExpression": update,
                "ConditionExpression": condition,
                "ExpressionAttributeNames": names,
                "ExpressionAttributeValues": values,
            }
        }

    # ---------------------------------------------------------------- plumbing

    def _update(
        self,
        key: str,
        update: str,
        condition: str,
        names: Sequence[str],
        values: Mapping[str, Any],
        nested: bool = False,
        client: Any = None,
        extra_names: Mapping[str, str] | None = None,
    ) -> bool:
        attribute_names = {f"#e{i}": name for i, name in enumerate(names)}
        if nested:
            used = set(_NAME.findall(update + " " + condition))
            attribute_names.update({k: v for k, v in _NAMES.items() if k in used})
        attribute_names.update(extra_names or {})
        return self._write(key, update, condition, attribute_names, dict(values), client)

    def _write(
        self,
        key: str,
        update: str,
        condition: str,
        names: Mapping[str, str],
        values: Mapping[str, Any],
        client: Any = None,
    ) -> bool:
        try:
            (client or self.client).update_item(
                TableName=self.table,
                Key={"k": {"S": key}},
                UpdateExpression=update,
                ConditionExpression=condition,
                ExpressionAttributeNames=dict(names),
                ExpressionAttributeValues=dict(values),
            )
        except ClientError as exc:
            if condition_failed(exc):
                return False
            raise
        return True


def chunks(entries: Mapping[str, Any], size: int = CHUNK) -> list[dict[str, Any]]:
    """Split a claim item's entries into writes of at most ``size``."""
    names = list(entries)
    return [{n: entries[n] for n in names[i : i + size]} for i in range(0, len(names), size)]


Reader = Callable[[Sequence[EntryRef]], Mapping[EntryRef, Entry | None]]

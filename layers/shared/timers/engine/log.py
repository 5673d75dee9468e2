"""The fire log (DynamoDB ``claims`` table): one entry per fire position, packed by second.

Item ``k = "<partition>/<second>"``; each entry is a top-level map attribute ``<timer>@<ms>``
(:mod:`timers.engine.entries`), so one conditional UpdateItem claims or records a chunk of fires
(boto3's low-level client: entry names are data). Entries only move forward (R1); a sealed item
takes no new entry, its positions live below it ("Claim items stay small" in docs/fire-path.md).
Reads fetch whole items: a projection naming each wanted entry of 100 items outgrew DynamoDB's
4 KB expression limit, and a read costs the item's size either way.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, cast

from botocore.exceptions import ClientError

from timers.core.errors import ConcurrentUpdate
from timers.engine.entries import Entry, EntryRef, path_hash
from timers.store.dynamodb import Fields, LowLevelClient, condition_failed, from_map, to_map

CHUNK = 64
"""Entries per conditional write: a full item's (CLAIM_CAP), so that a windowed crowd leased in
its items' order claims and records each item in one write. DynamoDB counts ~4 operators per
recorded entry and allows 300 per expression (a record of 75 entries is refused), and 4 KB per
expression string."""
CLAIM_CAP = 64
"""Entries an item takes before it is sealed: ~6 KB. A write costs the item's size (1 WRU a
KB), so an item that grows past what one lease claims makes every later claim and record in it
dearer: at 256 entries a windowed instant of 300 fires cost 0.62 WRU a fire, at 64 0.41."""
MAX_DEPTH = 16  # hex digits of the timer hash
BATCH_GET = 100  # keys per BatchGetItem
TTL = "expires_at"
TTL_MARGIN_S = 86_400  # fire-log items outlive the timers they count by a day
SEALED, COUNT = "sl", "c"
SEALED_KNOWN = 1_024  # sealed items whose names a store remembers (only saves failed writes)

ENTRY_FIELDS: Fields = {
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


def to_entry(value: Mapping[str, Any]) -> Entry:
    return Entry(**from_map(value, ENTRY_FIELDS))


def entry_map(entry: Entry) -> dict[str, Any]:
    return to_map(entry, ENTRY_FIELDS)


def child_key(key: str, name: str) -> str:
    depth = key.count("/") - 1
    if depth >= MAX_DEPTH:
        raise RuntimeError(f"fire log: no room left on the path of {name} at {key}")
    timer_id = name.split("@", 1)[0]
    return f"{key}/{path_hash(timer_id)[depth]}"


def chunks(entries: Mapping[str, Any], size: int = CHUNK) -> list[dict[str, Any]]:
    names = list(entries)
    return [{n: entries[n] for n in names[i : i + size]} for i in range(0, len(names), size)]


@dataclass(frozen=True)
class Located:
    """An entry's home and what it holds there (None: absent; ``count``: the home's entries)."""

    key: str
    entry: Entry | None
    count: int = 0


class FireLog(LowLevelClient):
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
        self._record_client = record_client  # records may wait longer: a lost one re-sends
        self.cap = cap
        self._sealed: dict[str, frozenset[str]] = {}  # sealed item -> its names, for good
        self._filled: dict[str, int] = {}  # item -> its count as last known (counts only grow)

    def expires_at(self, key: str, entries: Iterable[Entry] = ()) -> int:
        """TTL of an item (epoch s): its second - or the latest time its entries name (a fire
        sent days late: its entry must outlive the timer) - plus the retention and a margin."""
        times = [t // 1000 for e in entries for t in (e.until, e.enqueued) if t]
        latest = max([int(key.split("/", 2)[1]), *times])
        return latest + self.retention_days * 86_400 + TTL_MARGIN_S

    def _ttl_set(self, key: str, entries: Iterable[Entry]) -> str:
        """The TTL's SET clause: raised to what ``entries`` need (their times only grow with
        the clock), else left as it is."""
        late = self.expires_at(key, entries) > self.expires_at(key)
        return f"{TTL} = :ttl" if late else f"{TTL} = if_not_exists({TTL}, :ttl)"

    # ---------------------------------------------------------------- reads

    def home_guess(self, ref: EntryRef, now_ms: int) -> str:
        """Where a new entry goes as far as this store knows: below each item known to be sealed
        without it (a guess: the claim's condition refuses a wrong one)."""
        key, name = ref
        while (names := self._sealed.get(key)) is not None and name not in names:
            if now_ms >= self.expires_at(key) * 1000:  # the TTL may have deleted it
                break
            key = child_key(key, name)
        return key

    def locate(
        self,
        refs: Iterable[EntryRef],
        consistent: bool = False,
        learn: bool = False,
        seen: Mapping[str, dict[str, Any]] | None = None,
    ) -> dict[EntryRef, Located]:
        """Each entry's home, from the root of its path down through sealed items that lack
        it; ``learn`` remembers the names of the sealed items passed; ``seen``: items just
        read (a failed claim's), not read again."""
        looking = {ref: ref[0] for ref in refs}
        found: dict[EntryRef, Located] = {}
        passed: set[str] = set()
        seen = seen or {}
        for _ in range(MAX_DEPTH + 1):
            if not looking:
                break
            keys = set(looking.values())
            known = {k: seen[k] for k in keys & set(seen)}
            items = known | self._items(keys - set(known), consistent)
            deeper: dict[EntryRef, str] = {}
            for ref, key in looking.items():
                item = items.get(key, {})
                if ref[1] in item:
                    found[ref] = Located(key, to_entry(item[ref[1]]))
                elif SEALED in item:
                    deeper[ref] = child_key(key, ref[1])
                    passed.add(key)
                    if learn and key not in self._sealed:
                        if len(self._sealed) >= SEALED_KNOWN:
                            self._sealed.clear()
                        self._sealed[key] = frozenset(n for n in item if "@" in n)
                else:
                    count = int(item[COUNT]["N"]) if COUNT in item else 0
                    found[ref] = Located(key, None, self._knows(key, count))
            looking = deeper
        return found

    def read(
        self, refs: Iterable[EntryRef], consistent: bool = False
    ) -> dict[EntryRef, Entry | None]:
        return {ref: at.entry for ref, at in self.locate(refs, consistent).items()}

    def read_one(self, ref: EntryRef) -> Entry | None:
        """The entry at this very item (consistent): for a claim's owner, who knows its home."""
        value = self._attribute(*ref)
        return None if value is None else to_entry(value)

    def _items(self, keys: set[str], consistent: bool) -> dict[str, dict[str, Any]]:
        """Whole items by BatchGetItem, BATCH_GET keys a call; unprocessed keys retried."""
        ordered = sorted(keys)
        out: dict[str, dict[str, Any]] = {}
        for start in range(0, len(ordered), BATCH_GET):
            request = {
                "Keys": [{"k": {"S": k}} for k in ordered[start : start + BATCH_GET]],
                "ConsistentRead": consistent,
            }
            pending: dict[str, Any] = {self.table: request}
            for _ in range(10):
                response = self.client.batch_get_item(RequestItems=pending)
                for item in response["Responses"].get(self.table, []):
                    out[item["k"]["S"]] = item
                if not (pending := response.get("UnprocessedKeys") or {}):
                    break
            else:
                raise RuntimeError("fire log: BatchGetItem kept returning unprocessed keys")
        return out

    def _attribute(self, key: str, name: str) -> Any:
        response = self.client.get_item(
            TableName=self.table,
            Key={"k": {"S": key}},
            ConsistentRead=True,
            ProjectionExpression="#a",
            ExpressionAttributeNames={"#a": name},
        )
        return response.get("Item", {}).get(name)

    # ---------------------------------------------------------------- the trigger's writes

    def claim(
        self, key: str, entries: Mapping[str, Entry], seen: dict[str, Any] | None = None
    ) -> bool:
        """Write every entry at once if none exists in ``key`` and the unsealed item has room.
        False: one exists, or no room (the caller locates them, sealing a full item); then the
        item as it stood is put in ``seen`` (DynamoDB returns it with the refusal: one read
        less for the caller)."""
        if not self._write(key, *self._claim_parts(key, entries), seen=seen):
            return False
        self._knows(key, self._filled.get(key, 0) + len(entries))
        return True

    def _knows(self, key: str, count: int) -> int:
        if len(self._filled) >= SEALED_KNOWN:  # bounded, as the sealed items' names
            self._filled.clear()
        self._filled[key] = count
        return count

    def surely_full(self, key: str, adding: int) -> bool:
        """Whether ``adding`` more entries would not fit ``key`` as far as this store knows (its
        claims filled it): a refused write costs the item's size, a read a quarter of it. Wrong
        only for an item the TTL deleted since (its second long past): a read more, no harm."""
        return self._filled.get(key, 0) + adding > self.cap

    def claim_update(self, key: str, entries: Mapping[str, Entry]) -> dict[str, Any]:
        """:meth:`claim` as a TransactWriteItems element (a claim ordered with a condition on
        the timer: run now)."""
        return _transact(self.table, key, *self._claim_parts(key, entries))

    def _claim_parts(
        self, key: str, entries: Mapping[str, Entry]
    ) -> tuple[str, str, dict[str, str], dict[str, Any]]:
        n = len(entries)
        if n > self.cap:
            raise ValueError(f"{n} entries do not fit an item of {self.cap}")
        update, names, values = self._entries_set(key, entries)
        return (
            update + ", #c = if_not_exists(#c, :zero) + :k",
            "attribute_not_exists(#sl) AND (attribute_not_exists(#c) OR #c <= :room)"
            + "".join(f" AND attribute_not_exists({a})" for a in names),
            {**names, "#sl": SEALED, "#c": COUNT},
            {**values, ":zero": {"N": "0"}, ":k": {"N": str(n)}, ":room": {"N": str(self.cap - n)}},
        )

    def _entries_set(
        self, key: str, entries: Mapping[str, Entry]
    ) -> tuple[str, dict[str, str], dict[str, Any]]:
        """``SET`` of each entry (as ``#e<i> = :v<i>``) and of the item's TTL, its names and
        values: what a claim and a record write."""
        names = {f"#e{i}": name for i, name in enumerate(entries)}
        values = {f":v{i}": entry_map(e) for i, e in enumerate(entries.values())}
        values[":ttl"] = {"N": str(self.expires_at(key, entries.values()))}
        sets = ", ".join(f"{a} = :v{i}" for i, a in enumerate(names))
        return f"SET {sets}, {self._ttl_set(key, entries.values())}", names, values

    def seal(self, key: str) -> None:
        """No new entry enters ``key`` from now on: its positions' homes are below it."""
        self.client.update_item(
            TableName=self.table,
            Key={"k": {"S": key}},
            UpdateExpression=f"SET #sl = :yes, {TTL} = if_not_exists({TTL}, :ttl)",
            ExpressionAttributeNames={"#sl": SEALED},
            ExpressionAttributeValues={
                ":yes": {"BOOL": True},
                ":ttl": {"N": str(self.expires_at(key))},
            },
        )

    def take_over(self, key: str, name: str, entry: Entry, old: Entry) -> bool:
        """Replace a fence of an older revision (a fresh claim) or a lapsed claim (a takeover,
        keeping its decision) by ``entry``, only if it is still exactly as read."""
        return self.take_over_many(key, {name: (entry, old)})

    def take_over_many(self, key: str, entries: Mapping[str, tuple[Entry, Entry]]) -> bool:
        """:meth:`take_over` for several entries of one item in one write: all of them, only
        if each is still exactly as read (else none)."""
        sets: list[str] = []
        conditions: list[str] = []
        names: dict[str, str] = {}
        values: dict[str, Any] = {}
        for i, (name, (entry, old)) in enumerate(entries.items()):
            condition, old_names, old_values = _exactly(old, i)
            sets.append(f"#e{i} = :v{i}")
            conditions.append(condition)
            names |= {f"#e{i}": name, **old_names}
            values |= {**old_values, f":v{i}": entry_map(entry)}
        return self._write(key, "SET " + ", ".join(sets), " AND ".join(conditions), names, values)

    def record(
        self, key: str, owner: str, entries: Mapping[str, Entry], release: bool = False
    ) -> bool:
        """Replace ``owner``'s claims by their outcomes (or, ``release``, to give them back, by
        lapsed claims: on the claims' client, whose calls end sooner - a release that fails
        only lets them lapse), only while each is ``owner``'s at the revision given (a change
        may have adopted it: :meth:`rewrite` merges)."""
        update, names, values = self._entries_set(key, entries)
        revs = {f":r{i}": {"N": str(e.rev)} for i, e in enumerate(entries.values())}
        return self._write(
            key,
            update,
            " AND ".join(f"{a}.#o = :own AND {a}.#r = :r{i}" for i, a in enumerate(names)),
            {**names, "#o": "o", "#r": "r"},
            {**values, ":own": {"S": owner}, **revs},
            client=self.client if release else self._record_client,
        )

    def rewrite(
        self, key: str, name: str, owner: str, mine: Entry, tries: int = 3, release: bool = False
    ) -> Entry | None:
        """One entry recorded like :meth:`record`, the revision and successor of a change's
        adoption winning over ours. None if it is no longer ``owner``'s (taken over); the
        stored entry if it already is ours (a retry of a record whose answer was lost)."""
        for _ in range(tries):
            stored = self.read_one((key, name))
            if stored is not None and stored.state != "p" and _as_recorded(stored, mine):
                return stored  # our record: applied, its answer lost
            if stored is None or stored.state != "p" or stored.owner != owner:
                return None
            merged = replace(mine, rev=stored.rev, next=stored.next, end=stored.end)
            if self.record(key, owner, {name: merged}, release):
                return merged
        return None

    # ---------------------------------------------------------------- a change's writes

    def fence_update(self, ref: EntryRef, fence: Entry) -> dict[str, Any]:
        """A TransactWriteItems element fencing an unclaimed position (R5); ConcurrentUpdate if
        it was claimed since the caller's walk. Only a new entry adds to the item's count (a
        fence over a fence does not: the edits of one timer never fill an item); the
        transaction fails if the entry is no longer as read."""
        at = self.locate([ref], consistent=True)[ref]
        if at.entry is None and at.count >= self.cap:
            self.seal(at.key)
            at = self.locate([ref], consistent=True)[ref]
        if at.entry is not None and at.entry.state != "t":
            raise ConcurrentUpdate("the timer's next fire was claimed; retry")
        ttl = {":v0": entry_map(fence), ":ttl": {"N": str(self.expires_at(at.key))}}
        if at.entry is not None:  # fenced again: the entry rewritten in place, nothing to count
            return _transact(
                self.table,
                at.key,
                f"SET #e0 = :v0, {TTL} = if_not_exists({TTL}, :ttl)",
                "#e0.#s = :t",
                {"#e0": ref[1], "#s": "s"},
                {**ttl, ":t": {"S": "t"}},
            )
        return _transact(
            self.table,
            at.key,
            f"SET #e0 = :v0, {TTL} = if_not_exists({TTL}, :ttl), "
            "#c = if_not_exists(#c, :zero) + :one",
            "attribute_not_exists(#e0) AND attribute_not_exists(#sl) AND "
            "(attribute_not_exists(#c) OR #c <= :room)",
            {"#e0": ref[1], "#sl": SEALED, "#c": COUNT},
            {**ttl, ":zero": {"N": "0"}, ":one": {"N": "1"}, ":room": {"N": str(self.cap - 1)}},
        )

    def adopt_update(self, ref: EntryRef, adopted: Entry, old: Entry) -> dict[str, Any]:
        """A TransactWriteItems element handing a pending claim to the change's revision (R5),
        only if it is still exactly as read."""
        at = self.locate([ref], consistent=True)[ref]
        if at.entry != old:
            raise ConcurrentUpdate("the timer's pending fire moved on; retry")
        condition, names, values = _exactly(old)
        return _transact(
            self.table,
            at.key,
            "SET #e0 = :v0",
            condition,
            {"#e0": ref[1], **names},
            {**values, ":v0": entry_map(adopted)},
        )

    # ---------------------------------------------------------------- plumbing

    def _write(
        self,
        key: str,
        update: str,
        condition: str,
        names: Mapping[str, str],
        values: Mapping[str, Any],
        client: Any = None,
        seen: dict[str, Any] | None = None,
    ) -> bool:
        old = {"ReturnValuesOnConditionCheckFailure": "ALL_OLD"} if seen is not None else {}
        request = _transact(self.table, key, update, condition, names, values)["Update"]
        try:
            (client or self.client).update_item(**request, **old)
        except ClientError as exc:
            if condition_failed(exc):
                item = cast(dict[str, Any], exc.response).get("Item")
                if seen is not None and item is not None:
                    seen[key] = item
                return False
            raise
        return True


def _exactly(old: Entry, i: int = 0) -> tuple[str, dict[str, str], dict[str, Any]]:
    """The condition that entry ``#e<i>`` is still ``old``: a fence of its revision, or a
    pending claim of its owner, validity and revision."""
    values = {f":os{i}": {"S": old.state}, f":orev{i}": {"N": str(old.rev)}}
    names = {"#s": "s", "#r": "r"}
    if old.state == "t":
        return f"#e{i}.#s = :os{i} AND #e{i}.#r = :orev{i}", names, values
    return (
        f"#e{i}.#s = :os{i} AND #e{i}.#o = :oo{i} AND #e{i}.#u = :ou{i} AND #e{i}.#r = :orev{i}",
        {**names, "#o": "o", "#u": "u"},
        {**values, f":oo{i}": {"S": old.owner or ""}, f":ou{i}": {"N": str(old.until or 0)}},
    )


def _transact(
    table: str,
    key: str,
    update: str,
    condition: str,
    names: Mapping[str, str],
    values: Mapping[str, Any],
) -> dict[str, Any]:
    """A conditional UpdateItem of ``key``, as a TransactWriteItems element."""
    return {
        "Update": {
            "TableName": table,
            "Key": {"k": {"S": key}},
            "UpdateExpression": update,
            "ConditionExpression": condition,
            "ExpressionAttributeNames": dict(names),
            "ExpressionAttributeValues": dict(values),
        }
    }


def _as_recorded(stored: Entry, mine: Entry) -> bool:
    """Whether ``stored`` is ``mine`` as recorded (a change may have merged its revision and
    successor): a takeover records its own send, at another instant."""
    return replace(stored, rev=mine.rev, next=mine.next, end=mine.end) == mine

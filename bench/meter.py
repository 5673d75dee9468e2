"""What the cost benchmark counts, and how: request units, requests, round trips, log bytes.

DynamoDB units follow DynamoDB's rules from the item images, because moto's ``ConsumedCapacity``
is a constant per call (1.0 per write, 0.5 per read) that ignores item size and index writes:

- a write costs ceil(max(before, after) / 1 KB), a failed condition the existing item's size;
  in a transaction every element costs twice that;
- every global secondary index entry put, deleted or updated costs its own ceil(size / 1 KB),
  and a changed index key costs a delete plus a put;
- a read costs ceil(size / 4 KB), half when eventually consistent, on the *whole* item even when
  a projection returns part of it; a query once per page on the summed size it read.

Write hooks read the items before (and after) through a separate, uncounted client.
"""

from __future__ import annotations

import copy
import math
import os
import sys
import tempfile
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import redis

from ops import template

CALLS = ("dynamodb.calls.", "sqs.calls.")
"""Counted keys that are one request to AWS each (a function waits for its answer)."""


class Meter:
    """Every counted unit in one Counter: a scenario's cost is the difference of snapshots."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()
        self.scope: str | None = None  # the function whose handler runs (one at a time)

    def add(self, key: str, amount: float = 1) -> None:
        with self._lock:
            self.counts[key] += amount  # type: ignore[assignment]
            if self.scope and key.startswith(CALLS):  # its share: billed as waits on AWS
                share = f"calls.{self.scope}.{key.split('.')[0]}"
                self.counts[share] += amount  # type: ignore[assignment]

    def snapshot(self) -> dict[str, float]:
        with self._lock:
            return dict(self.counts)


# ---------------------------------------------------------------- DynamoDB sizes and units


def _number_size(text: str) -> int:
    digits = text.lstrip("+-").replace(".", "").lstrip("0").rstrip("0") or "0"
    return (len(digits) + 1) // 2 + 1


def attr_size(value: dict[str, Any]) -> int:
    """Bytes of one attribute value as DynamoDB sizes it."""
    ((kind, v),) = value.items()
    if kind == "S":
        return len(v.encode())
    if kind == "N":
        return _number_size(v)
    if kind in ("B", "BS"):
        return len(v) if kind == "B" else sum(len(b) for b in v)
    if kind in ("BOOL", "NULL"):
        return 1
    if kind in ("SS", "NS"):
        return sum(len(s.encode()) if kind == "SS" else _number_size(s) for s in v)
    if kind == "L":
        return 3 + sum(attr_size(e) + 1 for e in v)
    if kind == "M":
        return 3 + sum(len(k.encode()) + attr_size(e) + 1 for k, e in v.items())
    raise ValueError(f"unknown attribute type {kind}")


def item_size(item: dict[str, Any] | None) -> int:
    return sum(len(k.encode()) + attr_size(v) for k, v in (item or {}).items())


def write_units(size: int) -> int:
    return max(1, math.ceil(size / 1024))


def read_units(size: int, consistent: bool) -> float:
    units = max(1, math.ceil(size / 4096))
    return float(units) if consistent else units / 2


@dataclass(frozen=True)
class Gsi:
    keys: tuple[str, ...]
    projection: str  # ALL | KEYS_ONLY | INCLUDE
    include: tuple[str, ...] = ()


@dataclass(frozen=True)
class TableSpec:
    keys: tuple[str, ...]
    gsis: tuple[Gsi, ...]

    def key_of(self, item: dict[str, Any]) -> dict[str, Any]:
        return {k: item[k] for k in self.keys}

    def entry(self, gsi: Gsi, item: dict[str, Any] | None) -> dict[str, Any] | None:
        """The item's entry in a GSI (None: sparse index, a key attribute is missing)."""
        if item is None or any(k not in item for k in gsi.keys):
            return None
        if gsi.projection == "ALL":
            return dict(item)
        names = set(self.keys) | set(gsi.keys) | set(gsi.include)
        return {k: v for k, v in item.items() if k in names}

    def gsi_units(self, old: dict[str, Any] | None, new: dict[str, Any] | None) -> int:
        units = 0
        for gsi in self.gsis:
            before, after = self.entry(gsi, old), self.entry(gsi, new)
            if before == after:
                continue
            if before is None or after is None:
                units += write_units(item_size(before or after))
            elif any(before[k] != after[k] for k in gsi.keys):
                units += write_units(item_size(before)) + write_units(item_size(after))
            else:
                units += write_units(item_size(after))
        return units


def table_specs(names: dict[str, str]) -> dict[str, TableSpec]:
    """Key schema and GSIs of every table of template.yaml, by deployed table name."""
    specs = {}
    for logical_id, props in template.resources("AWS::DynamoDB::Table").items():
        gsis = tuple(
            Gsi(
                tuple(k["AttributeName"] for k in g["KeySchema"]),
                g["Projection"]["ProjectionType"],
                tuple(g["Projection"].get("NonKeyAttributes", ())),
            )
            for g in props.get("GlobalSecondaryIndexes", ())
        )
        keys = tuple(k["AttributeName"] for k in props["KeySchema"])
        specs[names.get(logical_id, logical_id)] = TableSpec(keys, gsis)
    return specs


Write = tuple[str, dict[str, Any], dict[str, Any] | None]  # (table, key, item put or None)


class DynamoHooks:
    """botocore hooks on a DynamoDB client: request units by DynamoDB's rules."""

    def __init__(self, meter: Meter, raw: Any, specs: dict[str, TableSpec]) -> None:
        self.meter, self.raw, self.specs = meter, raw, specs

    def register(self, client: Any) -> None:
        client.meta.events.register("before-parameter-build.dynamodb", self.before)
        client.meta.events.register("after-call.dynamodb", self.after)

    def _get(self, table: str, key: dict[str, Any]) -> dict[str, Any] | None:
        item: dict[str, Any] | None = self.raw.get_item(
            TableName=table, Key=key, ConsistentRead=True
        ).get("Item")
        return item

    def _writes(self, op: str, p: dict[str, Any]) -> list[Write]:
        """Every item a write call touches: (table, key, the item it puts, if a put)."""
        if op in ("PutItem", "UpdateItem", "DeleteItem"):
            spec = self.specs[p["TableName"]]
            item = p.get("Item")
            return [(p["TableName"], p.get("Key") or spec.key_of(item or {}), item)]
        out: list[Write] = []
        if op == "BatchWriteItem":
            for table, requests in p["RequestItems"].items():
                for r in requests:
                    put = r.get("PutRequest", {}).get("Item")
                    key = r["DeleteRequest"]["Key"] if "DeleteRequest" in r else None
                    out.append((table, key or self.specs[table].key_of(put or {}), put))
        elif op == "TransactWriteItems":
            for element in p["TransactItems"]:
                ((kind, body),) = element.items()
                item = body.get("Item")
                key = body.get("Key") or self.specs[body["TableName"]].key_of(item or {})
                out.append((body["TableName"], key, item if kind == "Put" else None))
        return out

    def before(self, params: dict[str, Any], model: Any, context: dict[str, Any], **_: Any) -> None:
        context["bench_params"] = copy.deepcopy(params)
        writes = self._writes(model.name, params)
        context["bench_old"] = [self._get(t, k) for t, k, _ in writes]

    def after(
        self, http_response: Any, parsed: dict[str, Any], model: Any, context: dict[str, Any],
        **_: Any,
    ) -> None:  # fmt: skip
        op, params = model.name, context.get("bench_params", {})
        ok = http_response.status_code < 300
        self.meter.add(f"dynamodb.calls.{op}")
        reported = parsed.get("ConsumedCapacity")
        for c in reported if isinstance(reported, list) else [reported] if reported else []:
            self.meter.add("dynamodb.moto_reported_units", float(c.get("CapacityUnits", 0)))
        writes = self._writes(op, params)
        factor = 2 if op == "TransactWriteItems" else 1
        for (table, key, put), old in zip(writes, context.get("bench_old", []), strict=True):
            if not ok:  # a failed condition still costs the existing item's size
                self.meter.add("dynamodb.wru.table", factor * write_units(item_size(old)))
                continue
            new = put if put is not None else self._get(table, key)
            units = write_units(max(item_size(old), item_size(new)))
            self.meter.add("dynamodb.wru.table", factor * units)
            self.meter.add("dynamodb.wru.gsi", self.specs[table].gsi_units(old, new))
            self.meter.add(f"dynamodb.wru.{table}", factor * units)
        if not writes and ok:
            self._read(op, params, parsed)

    def _read(self, op: str, params: dict[str, Any], parsed: dict[str, Any]) -> None:
        if op == "GetItem":
            item = parsed.get("Item")
            if item and "ProjectionExpression" in params:
                item = self._get(params["TableName"], params["Key"])
            self.meter.add("dynamodb.rru", read_units(item_size(item), bool(
                params.get("ConsistentRead"))))  # fmt: skip
        elif op == "BatchGetItem":
            for table, request in params["RequestItems"].items():
                consistent = bool(request.get("ConsistentRead"))
                for item in parsed.get("Responses", {}).get(table, []):
                    if "ProjectionExpression" in request:  # charged on the whole item
                        item = self._get(table, self.specs[table].key_of(item)) or item
                    self.meter.add("dynamodb.rru", read_units(item_size(item), consistent))
                found = len(parsed.get("Responses", {}).get(table, []))
                missing = len(request["Keys"]) - found
                self.meter.add("dynamodb.rru", missing * read_units(0, consistent))
        elif op in ("Query", "Scan"):
            size = sum(item_size(i) for i in parsed.get("Items", []))
            self.meter.add("dynamodb.rru", read_units(size, bool(params.get("ConsistentRead"))))


class SqsHooks:
    """botocore hooks on an SQS client: calls, billed requests (per 64 KB) and payload bytes."""

    CHUNK = 64 * 1024

    def __init__(self, meter: Meter) -> None:
        self.meter = meter

    def register(self, client: Any) -> None:
        client.meta.events.register("before-parameter-build.sqs", self.before)
        client.meta.events.register("after-call.sqs", self.after)

    def before(self, params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        context["bench_params"] = params

    def after(self, model: Any, context: dict[str, Any], **_: Any) -> None:
        params = context.get("bench_params", {})
        entries = params.get("Entries") if model.name == "SendMessageBatch" else [params]
        size = 0
        for e in entries or []:
            size += len(e.get("MessageBody", "").encode())
            for name, attr in e.get("MessageAttributes", {}).items():
                size += len(name) + len(attr.get("DataType", "")) + len(attr.get("StringValue", ""))
        self.meter.add(f"sqs.calls.{model.name}")
        self.meter.add("sqs.payload_bytes", size)
        self.meter.add("sqs.requests", max(1, math.ceil(size / self.CHUNK)))


# ---------------------------------------------------------------- Redis and logs


class CountingConnection(redis.Connection):
    """One count per command or pipeline written to the socket: a round trip. The connection
    handshake (once per cold start in Lambda) is not counted."""

    round_trips = 0
    _lock = threading.Lock()

    def on_connect(self) -> None:
        self._handshake = True
        try:
            super().on_connect()
        finally:
            self._handshake = False

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        if not getattr(self, "_handshake", False):
            with CountingConnection._lock:
                CountingConnection.round_trips += 1
        super().send_packed_command(command, check_health)


def redis_commands(admin_client: Any) -> int:
    """Commands executed so far, scripts' inner calls included (INFO itself excluded)."""
    stats = admin_client.info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items() if k != "cmdstat_info")


@contextmanager
def captured_stdout() -> Iterator[Callable[[], int]]:
    """Send fd 1 to a temp file (what CloudWatch Logs would ingest); yields a byte counter."""
    sys.stdout.flush()
    saved = os.dup(1)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 1)

        def size() -> int:
            sys.stdout.flush()
            return os.fstat(sink.fileno()).st_size

        try:
            yield size
        finally:
            sys.stdout.flush()
            os.dup2(saved, 1)
            os.close(saved)

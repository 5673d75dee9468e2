"""moto's server as the local stack runs it: ``python -m ops.local.moto_server -p PORT``.

The same server as ``python -m moto.server`` (same arguments), refusing what AWS refuses
(``ops.aws_limits``: DynamoDB's item, key, expression, batch, transaction and page limits,
SQS's message and batch sizes) and taking the long update expressions AWS takes
(``DEEP_EXPRESSION_FRAMES``), with a race of moto's SQS closed (``atomic_sqs_delete``: a
delete could drop a message sent at the same instant) and four of moto's costs taken out.
None of those four changes what any request returns; each only changes how much of moto's one
core (one process, one GIL, shared by DynamoDB and SQS) a request burns:

- **Its clock.** moto reads "now" by building two datetimes and subtracting them
  (``moto.core.utils.unix_time``, ≈ 5 µs a call), and its SQS asks the clock about every
  message of a queue on each scan (visible? delayed?). Without an argument ``unix_time`` is
  the current POSIX time; here it is ``time.time()``, the same number for ≈ 50x less work.
  With a datetime it is moto's own.
- **The retention check of a received message** read *all* of the queue's attributes, three
  approximate counts included (three scans of the queue, computed three times), for each
  message it returned; here it reads the one attribute it needs.
- **DynamoDB's clause-count check** of an update expression ran at every node of its syntax
  tree (quadratic in the actions; see ``cheap_action_count_check``); here at the root only.
- **A transaction's backup** was a deep copy of every table it touched; here of the items it
  names (``cheap_transaction_backup``).

Measured in-process on a queue holding 300 messages (moto 5.2, Python 3.11): one
``ReceiveMessage`` of 10 took ≈ 210 ms of CPU, now ≈ 8 ms; one ``SendMessageBatch`` of 10
(each send reads the queue's attributes too) ≈ 50-75 ms, now ≈ 4-7 ms. The scans themselves
stay: moto still gets slower with queue depth, SQS does not (≈ 10-20 ms per call at any depth).
A claim or record of 50 entries (one ``UpdateItem``) costs ≈ 15-20 % less; it stays ≈ 50-100 ms
of moto's CPU (expression parsing, mostly; moto's own 400 KB check, which re-sized the whole item
at every attribute set, gives way to ``ops.aws_limits``' one sizing per write), where DynamoDB
answers in ≈ 5-10 ms.
"""

from __future__ import annotations

import datetime
import sys
import time
from collections.abc import Callable
from typing import Any

import moto.core.utils as moto_utils

from ops import aws_limits

_moto_unix_time: Callable[[datetime.datetime | None], float] = moto_utils.unix_time


def unix_time(dt: datetime.datetime | None = None) -> float:
    """Seconds since the epoch of ``dt`` (naive UTC), or of now."""
    return time.time() if dt is None else _moto_unix_time(dt)


def cheap_clock() -> None:
    """Point moto's clock, and SQS's own reference to it, at ``unix_time``."""
    moto_utils.unix_time = unix_time  # unix_time_millis looks it up here, on every call
    import moto.sqs.models as sqs_models  # holds its own reference (from ... import)

    getattr(sqs_models, "unix_time")  # noqa: B009 (moved?)
    sqs_models.unix_time = unix_time


def _retained(self: Any, queue_name: str, message: Any) -> bool:
    """moto's retention check of a message being received, reading the one attribute it
    needs instead of all of the queue's (three scans of the queue per message received)."""
    retention_s: int = self.get_queue(queue_name).message_retention_period
    return bool(retention_s + message.sent_timestamp / 1000 > unix_time())


def cheap_retention_check() -> None:
    from moto.sqs.models import SQSBackend

    getattr(SQSBackend, "is_message_valid_based_on_retention_period")  # noqa: B009 (moved?)
    SQSBackend.is_message_valid_based_on_retention_period = _retained  # type: ignore[method-assign]


def cheap_action_count_check() -> None:
    """moto checks that an update expression has at most one SET, REMOVE and ADD clause at
    every node of its syntax tree, each check searching the node's whole subtree: quadratic in
    the expression's actions (a claim of 50 entries is ~500 nodes, ≈ 20 % of its UpdateItem).
    The root's search finds every clause (clauses do not nest in clauses of their own kind),
    so a check at the root alone refuses exactly the expressions the per-node checks refuse."""
    from moto.dynamodb.parsing.validators import ActionCountValidator

    per_node = ActionCountValidator.verify_action_counts

    def at_the_root(self: Any, node: Any) -> Any:
        return per_node(self, node) if node.parent is None else node

    ActionCountValidator.verify_action_counts = at_the_root  # type: ignore[method-assign]


def atomic_sqs_delete() -> None:
    """moto's DeleteMessage rebuilds the queue's message list without the lock its sends append
    under: a message sent between the rebuild's read and its write is dropped (SQS accepted it,
    no receive ever sees it). Ten of a 10,000-fire hot second were lost that way (the triggers'
    logs show all 10,000 accepted). Here the rebuild holds the queue's lock."""
    from moto.sqs.models import Queue

    unlocked = Queue.delete_message

    def delete_message(self: Any, receipt_handle: str) -> None:
        with self._messages_lock:
            unlocked(self, receipt_handle)

    Queue.delete_message = delete_message  # type: ignore[method-assign]


def cheap_transaction_backup() -> None:
    """moto's TransactWriteItems deep-copies every table it touches, whole, to put it back if
    an action fails: O(table) per transaction - a change of one timer copied every timer,
    listing and claim item (a table of 10,000 timers made each change ~100 times slower).
    Here only the items the transaction names are kept, and put back if it fails: the same
    answers, and a failed transaction leaves the tables as they were. (aws_limits answers one
    DynamoDB request at a time on each table a request names, so nothing else writes them
    meanwhile.)"""
    import copy as copy_module

    import moto.dynamodb.models as models

    transact = models.DynamoDBBackend.transact_write_items
    table_class = models.Table

    class NoTableCopies:
        """``copy`` as the transaction sees it: a table is its own backup (never replaced)."""

        @staticmethod
        def deepcopy(value: Any, memo: Any = None) -> Any:
            if isinstance(value, table_class):
                return value
            return copy_module.deepcopy(value, memo)

    def transact_write_items(self: Any, transact_items: list[dict[str, Any]]) -> None:
        saved = []
        for entry in transact_items:
            _, op = next(iter(entry.items()))
            table = self.tables.get(op.get("TableName"))
            try:
                keys = op.get("Key") or {
                    k: op["Item"][k] for k in (table.hash_key_attr, table.range_key_attr) if k
                }
                hash_key, range_key = self.get_keys_value(table, keys)
            except Exception:  # moto's own validation answers it
                continue
            item = table.get_item(hash_key, range_key)
            saved.append((table, hash_key, range_key, copy_module.deepcopy(item)))
        models.copy = NoTableCopies  # type: ignore[assignment]
        try:
            transact(self, transact_items)
        except BaseException:
            for table, hash_key, range_key, item in reversed(saved):
                table.delete_item(hash_key, range_key)
                if item is not None and range_key is not None:
                    table.items[hash_key][range_key] = item
                elif item is not None:
                    table.items[hash_key] = item
            raise
        finally:
            models.copy = copy_module

    models.DynamoDBBackend.transact_write_items = transact_write_items  # type: ignore[method-assign]


DEEP_EXPRESSION_FRAMES = 20_000
"""moto parses and copies an update expression recursively: one DynamoDB takes (287 SET
actions fill its 4 KB) needs more than Python's default 1,000 frames, and moto answered 500.
Raised here, in the server's own process, not in the tests' (the api relies on the default to
refuse a body nested 2,000 deep)."""


def main(argv: list[str]) -> None:
    aws_limits.install()
    sys.setrecursionlimit(DEEP_EXPRESSION_FRAMES)
    patches = (cheap_clock, cheap_retention_check, cheap_action_count_check, atomic_sqs_delete,
               cheap_transaction_backup)  # fmt: skip
    for patch in patches:
        try:  # moto is not pinned: a patch whose target moved is named, the server still runs
            patch()
        except (ImportError, AttributeError) as exc:
            print(f"moto_server: {patch.__name__} not applied ({exc})", file=sys.stderr)
    from moto import server

    server.main(argv)


if __name__ == "__main__":
    main(sys.argv[1:])

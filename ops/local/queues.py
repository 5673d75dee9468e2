"""The template's SQS event sources, polled the way Lambda's poller does.

For each source: long-poll the queue for up to BatchSize messages (waiting at most
MaximumBatchingWindowInSeconds to fill a batch), invoke the function synchronously with the
SQS event Lambda would build, then delete what succeeded. An invocation that fails leaves its
whole batch on the queue (back after the visibility timeout); with ``ReportBatchItemFailures``
only the ``batchItemFailures`` stay. Batches run concurrently up to ScalingConfig's
MaximumConcurrency (else the function's sandbox count), and the poller never holds messages
it has no sandbox for. Like Lambda's poller it scales up gradually: at most one batch more than
the function has sandboxes, so a burst waits for one cold start at a time instead of holding
messages while many sandboxes start at once on a small machine.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from ops.local.lambdas import Outcome
from ops.local.spec import QueueSourceSpec

POLL_WAIT_S = 1  # long poll: an idle queue costs a request a second


class Invoker(Protocol):
    def invoke(self, event: Any) -> Outcome: ...
    def sandboxes(self) -> int: ...


def sqs_event(records: Sequence[Mapping[str, Any]], source: QueueSourceSpec, region: str) -> Any:
    """The event Lambda's SQS poller passes to the function."""
    return {
        "Records": [
            {
                "messageId": m["MessageId"],
                "receiptHandle": m["ReceiptHandle"],
                "body": m["Body"],
                "attributes": dict(m.get("Attributes", {})),
                "messageAttributes": {
                    name: {
                        "stringValue": value.get("StringValue"),
                        "binaryValue": value.get("BinaryValue"),
                        "stringListValues": [],
                        "binaryListValues": [],
                        "dataType": value.get("DataType", "String"),
                    }
                    for name, value in m.get("MessageAttributes", {}).items()
                },
                "md5OfBody": m.get("MD5OfBody") or hashlib.md5(m["Body"].encode()).hexdigest(),
                "eventSource": "aws:sqs",
                "eventSourceARN": source.queue_arn,
                "awsRegion": region,
            }
            for m in records
        ]
    }


def settled(outcome: Outcome, record_ids: list[str], report_failures: bool) -> list[str]:
    """The message ids to delete after an invocation."""
    if outcome.function_error:
        return []
    if not report_failures:
        return record_ids
    try:
        response = json.loads(outcome.payload or b"null")
    except ValueError:
        return []
    failures = response.get("batchItemFailures") if isinstance(response, dict) else None
    if failures is None:
        return record_ids
    if not isinstance(failures, list):
        return []  # a malformed answer fails the whole batch, as Lambda treats it
    failed = {f.get("itemIdentifier") for f in failures if isinstance(f, dict)}
    if None in failed or "" in failed:
        return []
    return [i for i in record_ids if i not in failed]


class QueuePoller:
    """One thread per event source, and a pool of batch invocations."""

    def __init__(
        self,
        sources: list[QueueSourceSpec],
        sqs: Any,
        invokers: Mapping[str, Invoker],
        region: str,
        concurrency: int,
        report: Callable[[str], None],
    ) -> None:
        self._sources = sources
        self._sqs = sqs
        self._invokers = invokers
        self._region = region
        self._concurrency = concurrency
        self._report = report
        self._stop = threading.Event()
        self.threads: list[threading.Thread] = []
        self._pools: list[ThreadPoolExecutor] = []

    def start(self) -> None:
        for source in self._sources:
            width = min(self._concurrency, source.max_concurrency or self._concurrency)
            pool = ThreadPoolExecutor(width, thread_name_prefix=f"poll-{source.function}")
            self._pools.append(pool)
            thread = threading.Thread(
                target=self._poll,
                args=(source, pool, _Slots(width, self._invokers[source.function])),
                name=f"poller:{source.name}",
                daemon=True,
            )
            thread.start()
            self.threads.append(thread)

    def alive(self) -> bool:
        return all(t.is_alive() for t in self.threads)

    def stop(self) -> None:
        self._stop.set()
        for thread in self.threads:
            thread.join(POLL_WAIT_S + 2)
        for pool in self._pools:
            pool.shutdown(wait=False, cancel_futures=True)

    def _poll(self, source: QueueSourceSpec, pool: ThreadPoolExecutor, free: _Slots) -> None:
        while not self._stop.is_set():
            if not free.acquire(timeout=0.5):
                continue  # every batch slot busy: leave the messages on the queue
            try:
                messages = self._receive(source)
            except Exception as exc:  # moto restarting, or stopping: try again shortly
                free.release()
                if not self._stop.is_set():
                    self._report(f"{source.name}: receive failed: {exc}")
                    self._stop.wait(1)
                continue
            if not messages:
                free.release()
                continue
            pool.submit(self._run, source, messages, free)

    def _receive(self, source: QueueSourceSpec) -> list[dict[str, Any]]:
        batch: list[dict[str, Any]] = []
        deadline = time.monotonic() + source.window_s
        while len(batch) < source.batch_size and not self._stop.is_set():
            wait = POLL_WAIT_S if not batch else max(0, int(deadline - time.monotonic()))
            response = self._sqs.receive_message(
                QueueUrl=source.queue_url,
                MaxNumberOfMessages=min(10, source.batch_size - len(batch)),
                WaitTimeSeconds=wait,
                AttributeNames=["All"],
                MessageAttributeNames=["All"],
            )
            got = response.get("Messages", [])
            batch += got
            if not got or time.monotonic() >= deadline:
                break
        return batch

    def _run(
        self,
        source: QueueSourceSpec,
        messages: list[dict[str, Any]],
        free: _Slots,
    ) -> None:
        try:
            invoker = self._invokers[source.function]
            outcome = invoker.invoke(sqs_event(messages, source, self._region))
            ids = [m["MessageId"] for m in messages]
            done = set(settled(outcome, ids, source.report_failures))
            handles = [m["ReceiptHandle"] for m in messages if m["MessageId"] in done]
            for start in range(0, len(handles), 10):
                chunk = handles[start : start + 10]
                self._sqs.delete_message_batch(
                    QueueUrl=source.queue_url,
                    Entries=[{"Id": str(i), "ReceiptHandle": h} for i, h in enumerate(chunk)],
                )
        except Exception as exc:
            if not self._stop.is_set():
                self._report(f"{source.name}: batch failed: {exc}")
        finally:
            free.release()


class _Slots:
    """Batches in flight: at most ``width``, and at most one more than the started sandboxes."""

    def __init__(self, width: int, invoker: Invoker) -> None:
        self._width = width
        self._invoker = invoker
        self._busy = 0
        self._cond = threading.Condition()

    def _limit(self) -> int:
        return max(1, min(self._width, self._invoker.sandboxes() + 1))

    def acquire(self, timeout: float) -> bool:
        with self._cond:
            if not self._cond.wait_for(lambda: self._busy < self._limit(), timeout):
                return False
            self._busy += 1
            return True

    def release(self) -> None:
        with self._cond:
            self._busy -= 1
            self._cond.notify_all()

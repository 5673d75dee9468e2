"""The delivery function's batch: every message at once (a slow target holds up only its own),
the messages to one origin sharing the slots they took (timers.delivery.target_slots), and the
batch's delivered and failed fires counted in usage. One message's way is
timers.delivery.decisions.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from typing import Any

from timers.core.errors import trace_frames
from timers.delivery.decisions import (
    DeliveryDeps,
    Ready,
    Slots,
    add_usage,
    check,
    no_slot,
    post,
    settle_redriven,
)
from timers.delivery.messages import BatchReport, Message, Outcome
from timers.delivery.target_slots import Held

log = logging.getLogger(__name__)

BATCH_WORKERS = 10  # one per message of a full SQS batch
ROUNDS = 2
"""A batch's slot POSTs at most this many of its messages in turn (the rest are deferred):
with each attempt bounded by its timeout (10 s), a batch ends well within the function's."""


def _error(exc: BaseException) -> dict[str, Any]:
    """What a log line says of an error: its type and where, never its message (which can
    quote the message's target and its header values, a token typically)."""
    return {"error": type(exc).__name__, "trace": trace_frames(exc)}


class _Share:
    """The slots one batch took for its messages to one (tenant, origin): at most ``count``
    of them POST at once, and the slots are given back when the last is done."""

    def __init__(self, held: Held, messages: int, slots: Slots) -> None:
        self.held, self.slots = held, slots
        self.gate = threading.BoundedSemaphore(held.count)
        self.left, self.lock = messages, threading.Lock()

    def post(self, ready: Ready, deps: DeliveryDeps) -> Outcome:
        try:
            with self.gate:
                return post(ready, deps)
        finally:
            with self.lock:
                self.left -= 1
                last = self.left == 0
            if last:
                self.slots.release(self.held)


def deliver_batch(messages: Sequence[Message], deps: DeliveryDeps) -> BatchReport:
    """Every message of a batch at once: one slow target holds up only its own messages.

    The messages to one origin take their slots together (one write per cap, and one to give
    them back): as many as are free, each slot serving at most ROUNDS of them in turn; the
    rest are deferred, as when no slot is free."""
    report = BatchReport()
    if not messages:
        return report

    def guarded(message: Message, step: Callable[[], Outcome | Ready]) -> Outcome | Ready:
        try:
            return step()
        except Exception as exc:  # left on the queue: it comes back after its visibility timeout
            log.error("delivery failed", extra={"message_id": message.message_id, **_error(exc)})
            return Outcome("error")

    with ThreadPoolExecutor(min(BATCH_WORKERS, len(messages))) as pool:
        checked = list(pool.map(lambda m: guarded(m, lambda: check(m, deps)), messages))
        groups: dict[tuple[str, str], list[Ready]] = {}
        for result in checked:
            if isinstance(result, Ready):
                groups.setdefault((result.tenant, result.target.origin), []).append(result)
        pending: dict[str, Future[Outcome | Ready]] = {}
        for runs in pool.map(lambda group: _assign(group, deps), groups.values()):
            for ready, run in runs:
                message = ready.message
                pending[message.message_id] = pool.submit(guarded, message, run)
        outcomes = {m.message_id: r for m, r in zip(messages, checked, strict=True)}
        outcomes.update({message_id: future.result() for message_id, future in pending.items()})
    report.outcomes = {k: v for k, v in outcomes.items() if isinstance(v, Outcome)}
    _count(checked, report.outcomes, deps)
    return report


def _count(
    checked: Sequence[Outcome | Ready], outcomes: Mapping[str, Outcome], deps: DeliveryDeps
) -> None:
    """Add the batch's delivered and failed fires to their tenants' usage (one ADD each):
    those whose record this batch wrote, so two copies of one fire count once."""
    if deps.usage is None:
        return
    counts: dict[str, dict[str, int]] = {}
    for ready in checked:
        if not isinstance(ready, Ready):
            continue
        outcome = outcomes.get(ready.message.message_id, Outcome("error"))
        if outcome.recorded and outcome.verdict in ("delivered", "failed"):
            counts.setdefault(ready.tenant, {"delivered": 0, "failed": 0})[outcome.verdict] += 1
    add_usage(counts, deps)


def deliver(message: Message, deps: DeliveryDeps) -> Outcome:
    """One message, delivered as a batch of one."""
    return deliver_batch([message], deps).outcomes[message.message_id]


def _assign(group: list[Ready], deps: DeliveryDeps) -> list[tuple[Ready, Callable[[], Outcome]]]:
    """What each message to one (tenant, origin) does: POST under the slots the group took, or
    wait for a slot another time (or stay on the queue, if the slots could not be asked)."""
    if deps.slots is None:
        return [(ready, partial(post, ready, deps)) for ready in group]
    tenant, origin = group[0].tenant, group[0].target.origin
    try:
        held = deps.slots.acquire(tenant, origin, deps.clock(), len(group))
    except Exception as exc:  # left on the queue, as any error
        log.error("slots unavailable", extra={"tenant": tenant, **_error(exc)})
        return [(ready, partial(Outcome, "error")) for ready in group]
    served = min(len(group), held.count * ROUNDS) if held is not None else 0
    runs: list[tuple[Ready, Callable[[], Outcome]]] = []
    if held is not None:
        share = _Share(held, served, deps.slots)
        runs += [(ready, partial(share.post, ready, deps)) for ready in group[:served]]
    return runs + [(ready, partial(no_slot, ready, deps)) for ready in group[served:]]


def settle_batch(messages: Sequence[Message], deps: DeliveryDeps) -> BatchReport:
    """The redrive queue's batch, one message at a time (it is rare and each is quick)."""
    report = BatchReport()
    for message in messages:
        try:
            report.outcomes[message.message_id] = settle_redriven(message, deps)
        except Exception as exc:  # left on the redrive queue: tried again after its timeout
            log.error("settling failed", extra={"message_id": message.message_id, **_error(exc)})
            report.outcomes[message.message_id] = Outcome("error")
    return report

"""The delivery function's work on one message: POST its fire, decide what comes next (a batch
of them: timers.delivery.batches).

A message on the delivery queue is one fire of an HTTP target (the trigger put it there): its
body is the callback exactly as it is POSTed, its attributes say where to (``target``), whose
it is (``tenant``, for the signing secrets) and which claim entry it belongs to (``claim``).

Per message: read the fire's delivery record (a settled one means this is a duplicate: drop
it); take a slot of the tenant's caps (per origin, and across its origins; a batch's messages
to one origin take theirs together: timers.delivery.batches); none free: the message is sent
again with a delay (growing with each deferral) and this copy deleted - no attempt counted,
and a fresh message, so waiting for a slot never adds to the receive count that moves a
message to the DLQ; sign and POST; count the attempt in the record; then

- 2xx: delivered - the message is deleted;
- 408, 429, 5xx, timeout, connection error: retried - the message's visibility timeout is set
  to the backoff and it is reported as a batch item failure, so SQS hands it out again then;
  once the first attempt is RETRY_FOR_MS old the fire fails instead (and so does one that
  waits that long for a slot, counted from its due time when it was never attempted);
- anything else (3xx, other 4xx, a blocked address): failed at once.

A failed fire is recorded in the tenant's failed fires (with the message, so it can be
redelivered: :mod:`timers.api.failures`) and its message sent to the dead-letter queue (with the
reason) and deleted. A redelivered message (attribute ``redelivered``) reopens a record that
failed before its redelivery, whether or not the api's own reopening got there first. A
message the function itself keeps failing on (it crashes, times out) is moved by the queue's
redrive policy to the redrive queue, whose messages this function settles
(:func:`settle_redriven`): the fire fails ``dead_lettered`` unless already settled, and the
message goes on to the DLQ with the reason - so every dead letter has a reason, and its fire
shows it. Messages of one batch are handled concurrently, so a slow target delays only its
own messages.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

from timers.core.failures import FailedFire, redelivered_at
from timers.core.timer import fire_due_ms, fire_timer_id
from timers.core.webhook_attempts import (
    Attempt,
    DeliveryState,
    retry_wait_s,
    signed_headers,
    verdict,
)
from timers.core.webhooks import RETRY_FOR_MS, RetryPolicy, Webhook, gives_up
from timers.delivery.messages import (
    DEAD_LETTERED,
    Message,
    Outcome,
    defer_wait_s,
    deferrals,
    parse_claim,
)
from timers.delivery.target_slots import Held
from timers.engine.entries import EntryRef
from timers.tenancy.usage import add_quietly, month_of

log = logging.getLogger(__name__)


class DeliveryRecords(Protocol):
    def read_delivery(self, ref: EntryRef) -> DeliveryState | None: ...
    def write_delivery(
        self, ref: EntryRef, state: DeliveryState, previous: DeliveryState | None
    ) -> bool: ...


class FailedFires(Protocol):
    def put(self, record: FailedFire) -> None: ...


class Slots(Protocol):
    def acquire(self, tenant: str, origin: str, now_ms: int, want: int = 1) -> Held | None: ...
    def release(self, held: Held | None) -> None: ...  # never raises: a window ends a slot


@dataclass
class DeliveryDeps:
    records: DeliveryRecords
    slots: Slots | None
    secrets: Callable[[str], list[str]]  # tenant -> the secrets that sign now
    post: Callable[[str, bytes, Mapping[str, str]], Attempt]
    dead_letter: Callable[[Message, str], None]  # (message, reason) -> on the DLQ
    requeue: Callable[[Message, int], None]  # (message, delay s) -> on the queue again
    failed_fires: FailedFires  # where each failure is recorded, with its message
    clock: Callable[[], int]  # epoch ms
    jitter: Callable[[], float] = random.random
    retry_for_ms: int = RETRY_FOR_MS
    usage: Any = None  # the tenants' usage counters (timers.tenancy.usage; None: not counted)


@dataclass(frozen=True)
class Ready:
    """A message that passed its checks: its fire is not settled and it needs a slot."""

    message: Message
    ref: EntryRef
    target: Webhook
    tenant: str
    fire: str
    before: DeliveryState | None
    state: DeliveryState
    policy: RetryPolicy | None = None  # the timer's ``retry`` (None: the default budget)

    def budget_from(self, now_ms: int) -> int:
        """Where a policy's age counts from: the fire's redelivery, else its due time."""
        return redelivered_at(self.message.attributes) or fire_due_ms(self.fire) or now_ms

    def spent(self, state: DeliveryState, now_ms: int, retry_for_ms: int) -> str | None:
        """Why the timer's retry policy allows no further POST (None: it does, or none)."""
        if self.policy is None:
            return None
        return self.policy.spent(
            state.budget_attempts, self.budget_from(now_ms), state.first_ms, now_ms, retry_for_ms
        )


def _policy(message: Message) -> RetryPolicy | None:
    try:
        policy = RetryPolicy.from_json(message.attributes.get("retry"))
    except (ValueError, TypeError, AttributeError):
        return None
    return policy if policy is not None and not policy.errors() else None


def check(message: Message, deps: DeliveryDeps) -> Outcome | Ready:
    """The message's verdict when it needs no POST (invalid, a duplicate), else Ready."""
    attrs = message.attributes
    ref = parse_claim(attrs.get("claim", ""))
    try:
        target = Webhook.from_json(attrs["target"])
        tenant, fire = attrs["tenant"], attrs["fire_id"]
    except (KeyError, ValueError, TypeError):
        target = None
    if ref is None or target is None:
        reason = "invalid_message"
        deps.dead_letter(message, reason)
        return Outcome("invalid", reason=reason)
    before = deps.records.read_delivery(ref)
    current = _current(before, message)
    if current is not None and current.settled:
        # Delivered or failed already: SQS handed it out twice. A failure is recorded again
        # (a no-op if it was): this copy may be back because its first handler died between
        # the delivery record and the failed fire's.
        if current.failed is not None:
            _record_failure(message, current, deps)
        return Outcome("duplicate")
    return Ready(
        message, ref, target, tenant, fire, before, current or DeliveryState(), _policy(message)
    )


def no_slot(ready: Ready, deps: DeliveryDeps) -> Outcome:
    """The caps are reached: sent again with a growing delay, or failed once it has waited
    as long as a fire is retried."""
    state, now = ready.state, deps.clock()
    if ready.policy is not None:
        waited_out = ready.spent(state, now, deps.retry_for_ms) is not None
    else:
        waited_out = gives_up(state.first_ms or fire_due_ms(ready.fire) or now, now,
                              deps.retry_for_ms)  # fmt: skip
    if not waited_out:
        delay = defer_wait_s(deferrals(ready.message), deps.jitter())
        deps.requeue(ready.message, delay)  # then this copy is deleted: a fresh receive count
        return Outcome("deferred", reason=f"back in {delay} s")
    return _give_up(ready, f"gave up after {state.attempts} attempts: concurrency_cap", deps)


def post(ready: Ready, deps: DeliveryDeps) -> Outcome:
    """POST it (under a slot the caller holds), count the attempt, decide what comes next."""
    message, ref, state = ready.message, ready.ref, ready.state
    if (why := ready.spent(state, deps.clock(), deps.retry_for_ms)) is not None:
        return _spent(ready, why, deps)  # the timer's retry policy: no further POST
    attempt = _attempt(message, ready.target, ready.tenant, ready.fire, deps)
    now = deps.clock()
    after = state.after(attempt, now)
    result = verdict(attempt)
    outcome: Outcome
    why = None
    if result == "retry":
        why = ready.spent(after, now, deps.retry_for_ms)
        if ready.policy is None and gives_up(after.first_ms or now, now, deps.retry_for_ms):
            why = "max_age"
    if result == "delivered":
        after = replace(after, delivered_ms=now)
        outcome = Outcome("delivered")
    elif result == "retry" and why is None:
        wait = retry_wait_s(after.attempts, deps.jitter(), attempt.retry_after_s)
        seconds = max(1, round(wait))
        deadline = ready.policy.deadline_ms(ready.budget_from(now)) if ready.policy else None
        if deadline is not None and deadline - now < seconds * 1000:
            seconds = max(1, math.ceil((deadline - now) / 1000))  # back by then, to fail unsent
        outcome = Outcome("retry", retry_in_s=seconds, reason=attempt.label)
    else:
        reason = attempt.label
        if result == "retry":
            reason = f"gave up after {after.attempts} attempts: {attempt.label}"
            if ready.policy is not None:
                reason = f"gave up after {after.attempts} attempts ({why}): {attempt.label}"
        after = _failed(after, reason, message, now)
        outcome = Outcome("failed", reason=reason)
    recorded = deps.records.write_delivery(ref, after, ready.before)
    outcome = replace(outcome, recorded=recorded)
    if not recorded:
        # Another copy of this message counted an attempt meanwhile: its record stands, and
        # this outcome still holds for this copy (SQS's at-least-once; the consumer dedupes
        # on webhook-id).
        log.warning("delivery record changed meanwhile", extra={"fire_id": ready.fire})
    elif outcome.verdict == "failed":
        # After the delivery record, which names it (its failed-at time): a crash between
        # the two leaves the message on the queue, and its next copy writes this (above).
        _record_failure(message, after, deps)
    if outcome.verdict == "failed":
        deps.dead_letter(message, outcome.reason or "failed")
    return outcome


def _spent(ready: Ready, why: str, deps: DeliveryDeps) -> Outcome:
    """The retry policy's budget ran out while the message waited: failed, with no POST."""
    state = ready.state
    last = f": http {state.last_status}" if state.last_status is not None else (
        f": {state.last_error}" if state.last_error else "")  # fmt: skip
    return _give_up(ready, f"gave up after {state.attempts} attempts ({why}){last}", deps)


def _give_up(ready: Ready, reason: str, deps: DeliveryDeps) -> Outcome:
    """Failed for ``reason`` without a further POST; recorded unless another copy wrote
    first (then that copy's record stands and counts)."""
    failed = _failed(ready.state, reason, ready.message, deps.clock())
    recorded = deps.records.write_delivery(ready.ref, failed, ready.before)
    if recorded:
        _record_failure(ready.message, failed, deps)
    deps.dead_letter(ready.message, reason)
    return Outcome("failed", reason=reason, recorded=recorded)


def _failed(state: DeliveryState, reason: str, message: Message, now_ms: int) -> DeliveryState:
    """``state`` failed for ``reason``, now - but after the redelivery that sent this message,
    should this host's clock be behind the api's, so a copy of the message never takes this
    failure for one from before its redelivery (and reopens it)."""
    stamp = redelivered_at(message.attributes)
    failed_ms = now_ms if stamp is None else max(now_ms, stamp + 1)
    return replace(state, failed=reason, failed_ms=failed_ms)


def _current(before: DeliveryState | None, message: Message) -> DeliveryState | None:
    """The record as this message sees it: a redelivered message reopens a record that failed
    before its redelivery (the api reopens it too, but its write may come later, or never if
    it died after the send)."""
    redelivered = redelivered_at(message.attributes)
    if before is not None and redelivered is not None and before.redelivered_since(redelivered):
        return before.reopened(redelivered)
    return before


def _record_failure(message: Message, state: DeliveryState, deps: DeliveryDeps) -> None:
    """Put the failure in the tenant's failed fires, with the message that failed."""
    attrs = message.attributes
    tenant, fire = attrs.get("tenant", ""), attrs.get("fire_id", "")
    if not tenant or not fire or state.failed is None or state.failed_ms is None:
        return
    deps.failed_fires.put(
        FailedFire(
            tenant=tenant,
            fire_id=fire,
            timer_id=fire_timer_id(fire),
            reason=state.failed,
            last_status=state.last_status,
            attempts=state.attempts,
            failed_ms=state.failed_ms,
            body=message.body,
            attributes=dict(attrs),
        )
    )


def _attempt(
    message: Message, target: Webhook, tenant: str, fire: str, deps: DeliveryDeps
) -> Attempt:
    secrets = deps.secrets(tenant)
    if not secrets:
        return Attempt(error="no_signing_secret")
    body = message.body.encode()
    headers = {name: value for name, value in target.headers}
    headers.update(signed_headers(secrets, fire, deps.clock() // 1000, body))
    return deps.post(target.url, body, headers)


def settle_redriven(message: Message, deps: DeliveryDeps) -> Outcome:
    """A message SQS moved to the redrive queue after maxReceiveCount receives: the function
    kept failing on it (crashed, timed out), so nothing recorded why. Its fire fails
    ``dead_lettered`` unless already settled, and the message goes on to the DLQ with the
    reason. Raises when the record changed meanwhile (the message comes back, read again)."""
    ref = parse_claim(message.attributes.get("claim", ""))
    reason = DEAD_LETTERED
    if ref is not None:
        before = deps.records.read_delivery(ref)
        current = _current(before, message)
        if current is not None and current.delivered_ms is not None:
            return Outcome("duplicate")  # delivered before the crashes: nothing to dead-letter
        if current is not None and current.failed is not None:
            reason = current.failed  # failed already, but maybe killed before its dead letter
            _record_failure(message, current, deps)  # (and before its failed fire)
        else:
            state = current or DeliveryState()
            failed = _failed(state, reason, message, deps.clock())
            if not deps.records.write_delivery(ref, failed, before):
                raise RuntimeError("delivery record changed meanwhile")
            # counted by the write that failed it, before anything that may send it round again
            add_usage({message.attributes.get("tenant", ""): {"failed": 1}}, deps)
            _record_failure(message, failed, deps)
    deps.dead_letter(message, reason)
    return Outcome("dead_lettered", reason=reason)


def add_usage(counts: Mapping[str, Mapping[str, int]], deps: DeliveryDeps) -> None:
    """One ADD per tenant of this month."""
    if deps.usage is None:
        return
    month = month_of(deps.clock())
    for tenant, given in counts.items():
        add_quietly(deps.usage, tenant, month, given)

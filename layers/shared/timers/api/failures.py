"""Use cases of failed fires: list a tenant's, redeliver one or all of a timer's.

A redelivery sends the message that failed again - the same body and fire id, so consumers
still dedupe on ``webhook-id``, to the timer's HTTP target as it is now (a fixed URL or a new
token takes effect) - and makes the fire's delivery record pending again with a new
retry budget counted from the redelivery (its attempts kept). The failure's record says when
it was redelivered; if the fire fails again, that is a new failure with a record of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

from timers.api.cursors import decode_cursor, encode_cursor
from timers.core.errors import FieldError, InvalidInput, InvalidState, NotFound
from timers.core.failures import (
    KEY_MAX_MS,
    FailedFire,
    failed_fire_view,
    key_range,
)
from timers.core.timer import Timer, fire_due_ms, fire_timer_id
from timers.delivery.failed_fires import FailedFireStore
from timers.delivery.records import DeliveryRecords
from timers.engine.entries import ref_of
from timers.engine.log import FireLog
from timers.store.timers_table import TimerStore
from timers.tenancy.table import Tenant

REDELIVER_ALL_MAX = 100
"""Fires one ``fires:redeliver`` request redelivers at most; call it again for more."""
REDELIVER_ALL_READ = 10_000
"""Failures of the tenant it reads at most to find them (newest first): bounds its cost."""


class Sender(Protocol):
    def send(self, body: str, attributes: Mapping[str, str]) -> None: ...


@dataclass
class FailedFireService:
    failures: FailedFireStore
    timers: TimerStore
    log: FireLog
    records: DeliveryRecords
    delivery_queue: Sender
    clock: Callable[[], int]

    # ---------------------------------------------------------------- list

    def list_failed(
        self,
        tenant: Tenant,
        since_ms: int | None,
        until_ms: int | None,
        limit: int,
        cursor: str | None,
        include_redelivered: bool = False,
    ) -> dict[str, Any]:
        """A page of the tenant's failed fires that failed in [since, until], newest first;
        those redelivered only with ``include_redelivered`` (they are failures no more, unless
        they failed again: a new failure, listed)."""
        if since_ms is not None and until_ms is not None and since_ms > until_ms:
            raise InvalidInput(
                "since is after until", [FieldError("since", "must not be after until")]
            )
        low, high = key_range(since_ms, until_ms)
        # A cursor goes on in the window, and the filter, it came from only.
        scope = f"failed:{low}:{high}" + (":all" if include_redelivered else "")
        before = decode_cursor(cursor, tenant, scope)
        records, last = self.failures.page(
            tenant.name, low, high, limit, before, include_redelivered
        )
        names = self._names(tenant, {r.timer_id for r in records})
        return {
            "items": [failed_fire_view(r, names.get(r.timer_id)) for r in records],
            "next_cursor": encode_cursor(last, tenant, scope),
        }

    def _names(self, tenant: Tenant, timer_ids: set[str]) -> dict[str, str | None]:
        if not timer_ids:
            return {}
        found = self.timers.get_many([(tenant.name, t) for t in timer_ids], consistent=False)
        return {timer_id: timer.name for (_, timer_id), timer in found.items()}

    # ---------------------------------------------------------------- redeliver

    def redeliver(self, tenant: Tenant, timer_id: str, fire_id: str) -> dict[str, Any]:
        return self._redeliver(self._timer(tenant, timer_id), fire_id)

    def redeliver_all(self, tenant: Tenant, timer_id: str) -> dict[str, Any]:
        """Every failed fire of the timer not redelivered yet, at most REDELIVER_ALL_MAX (newest
        first); one that cannot be redelivered any more (delivered meanwhile) is left out."""
        timer = self._timer(tenant, timer_id)
        items: list[dict[str, Any]] = []
        seen: set[str] = set()
        for record in self.failures.not_redelivered(tenant.name, timer_id, REDELIVER_ALL_READ):
            if len(items) >= REDELIVER_ALL_MAX:
                break
            if record.fire_id in seen:
                continue
            seen.add(record.fire_id)
            try:
                items.append(self._redeliver(timer, record.fire_id))
            except (NotFound, InvalidState):
                continue
        return {"items": items}

    def _timer(self, tenant: Tenant, timer_id: str) -> Timer:
        timer = self.timers.get(tenant.name, timer_id)
        if timer is None:
            raise NotFound(f"no timer {timer_id!r}")
        return timer

    def _redeliver(self, timer: Timer, fire_id: str) -> dict[str, Any]:
        """Steps, in this order so that a crash at any point loses nothing and a retry finishes
        the work:

        1. mark the failure redelivered - the commit point;
        2. send its message again, stamped ``redelivered`` with that time;
        3. make the delivery record pending again, only over the failure it reopens.

        Killed after 1 or 2, the delivery record still holds this very failure and its record
        is marked: a retry sees exactly that and resumes from 2 (a second copy on the queue is
        what SQS's at-least-once gives anyway: the delivery record lets one copy count each
        attempt, consumers dedupe on webhook-id). The message reopens a record that failed
        before its stamp by itself, so a send whose step 3 never comes (or comes after the
        message) is delivered all the same; and step 3's condition keeps it from undoing an
        attempt the message already made. Reopening the record before the send would not do:
        killed in between, the fire would wait as pending with no message to deliver it, and a
        retry would find it not failed (409).
        """
        due = fire_due_ms(fire_id)
        if due is None or due > KEY_MAX_MS or fire_timer_id(fire_id) != timer.id:
            raise NotFound(f"no fire {fire_id!r} of timer {timer.id!r}")
        ref = ref_of(timer, due)
        at = self.log.locate([ref], consistent=True)[ref]
        entry = at.entry
        if entry is None or not entry.is_fire or (entry.fired or due) != due:
            raise NotFound(f"no fire {fire_id!r} of timer {timer.id!r}")
        if not entry.hook:
            raise InvalidState("only fires of HTTP targets (webhooks) can be redelivered")
        state = self.records.read_delivery(ref)
        if state is None or state.failed is None or state.failed_ms is None:
            shown = "delivered" if state and state.delivered_ms is not None else "not failed"
            raise InvalidState(f"fire {fire_id!r} is {shown}: only a failed fire is redelivered")
        record = self.failures.get(timer.tenant, state.failed_ms, fire_id)
        if record is None:
            raise NotFound(f"no failed fire {fire_id!r} of timer {timer.id!r}")
        record, stamp = self._marked(record)
        attributes = record.redelivery_attributes(stamp)
        if timer.webhook is not None:  # its target now: the user may have fixed the URL
            attributes["target"] = timer.webhook.to_json()
        attributes.pop("retry", None)  # and its retry policy now: a PATCH may have changed it
        if timer.retry is not None:
            attributes["retry"] = timer.retry.to_json()
        self.delivery_queue.send(record.body, attributes)
        self.records.reopen_delivery(ref, state.reopened(stamp), state)
        return failed_fire_view(record, timer.name)

    def _marked(self, record: FailedFire) -> tuple[FailedFire, int]:
        """The failure marked redelivered (step 1), and when: now, or when a request that died
        before finishing (or runs alongside) marked it."""
        if record.redelivered_ms is not None:
            return record, record.redelivered_ms
        # After the failure even if this host's clock is behind the delivery function's: the
        # message reopens only a failure from before its stamp.
        stamp = max(self.clock(), record.failed_ms + 1)
        if self.failures.mark_redelivered(record, stamp):
            return replace(record, redelivered_ms=stamp), stamp
        again = self.failures.get(record.tenant, record.failed_ms, record.fire_id)
        if again is None or again.redelivered_ms is None:
            raise InvalidState(f"fire {record.fire_id!r} changed meanwhile; retry")
        return again, again.redelivered_ms

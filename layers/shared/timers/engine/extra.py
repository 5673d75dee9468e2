"""Run now: one extra fire of a timer, besides its schedule, through the fire log - its
position, claim, listing, send and record ("Extra fires (run now)" in docs/fire-path.md)."""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from botocore.exceptions import ClientError

from timers.core.clock import ClockSync
from timers.core.errors import ConcurrentUpdate, Unavailable, trace_frames
from timers.core.schedule import first_fire, is_recurring, next_fire
from timers.core.timer import Timer
from timers.engine.callbacks import Delivery, Sender, SqsPort
from timers.engine.entries import Entry, EntryRef, ref_of
from timers.engine.log import TTL, TTL_MARGIN_S, FireLog
from timers.tenancy.usage import count_fires

log = logging.getLogger(__name__)

EXTRA_CLAIM_MS = 15_000
"""The api's claim of an extra fire holds this long: beyond its request's timeout (10 s)."""
EXTRA_KEPT = 100
"""Extra fires a timer's listing names (the newest): what its history shows of them."""
CLAIM_TRIES = 20  # milliseconds tried for a position nobody holds (another extra in the same)
POSITIONS = "ps"


def extra_key(partition: int, timer_id: str) -> str:
    return f"x/{partition}/{timer_id}"


def occurs_at(timer: Timer, pos: int) -> bool:
    """Whether ``pos`` is an occurrence of the timer's plan (where its chain may claim)."""
    if is_recurring(timer.schedule):
        return next_fire(timer.plan, pos - 1) == pos
    return first_fire(timer.plan) == pos


Load = Callable[[], tuple[Timer, int | None]]
"""The stored timer (consistent) and its cursor's position; NotFound once it is gone."""


@dataclass
class Extras:
    """Extra fires: run one now, list a timer's."""

    log: FireLog
    timers: Any  # the timers table (timers.store.timers_table.TimerStore)
    clock: Callable[[], int]  # this host's
    reference: Callable[[], int]  # the reference time (Redis TIME): the trigger's
    sqs: Callable[[], SqsPort]  # built on first use (the api's cold start needs no SQS)
    delivery_queue_url: str = ""
    retention_ms: int = 0
    sleep: Callable[[float], None] = time.sleep
    new_owner: Callable[[], str] = field(default=lambda: "api-" + uuid.uuid4().hex[:12])
    usage: Any = None  # the tenants' usage counters (timers.tenancy.usage; None: not counted)

    def run(self, load: Load) -> tuple[Timer, int, Entry]:
        """Fire the timer ``load`` reads (its current target and payload) once now; returns it,
        the position and its recorded entry (sent, or failed with the reason)."""
        timer, cursor_pos = load()
        owner = self.new_owner()
        sync = ClockSync(self.clock, self.reference)  # never early: the trigger's clock
        try:
            sync.measure()
        except Exception as exc:  # Redis unreachable: no reference time, no fire (nothing done)
            log.warning("run now: no reference time", extra={"trace": trace_frames(exc)})
            raise Unavailable("the service's clock cannot be read now; retry shortly") from None
        if not sync.trusted:
            raise Unavailable("the service's clock cannot be checked now; retry shortly")
        # the position: a time the reference has certainly reached (never early, no wait)
        timer, pos, ref, entry = self._claim(timer, cursor_pos, owner, sync.lower(), load)
        self._list(timer, pos)
        while (left := pos - sync.lower()) > 0:  # moved on past an occupied millisecond
            self.sleep(left / 1000)
        delivery = Delivery(timer, pos, ref=ref)
        sender = Sender(
            sqs=self.sqs(),
            clock=sync.now,
            sleep=self.sleep,
            may_attempt=lambda _: True,  # the api's own timeout bounds it
            delivery_queue_url=self.delivery_queue_url,
        )
        sender.send([delivery])
        done = replace(
            entry,
            state="d" if delivery.enqueued_ms is not None else "f",
            owner=None,
            until=None,
            enqueued=delivery.enqueued_ms if delivery.enqueued_ms is not None else sync.now(),
            reason=None if delivery.enqueued_ms is not None else delivery.failure or "not sent",
            hook=timer.webhook is not None,
        )
        if not self.log.record(ref[0], owner, {ref[1]: done}):
            # Sent (or tried) already: never an error a retry would answer with another fire.
            # Its answer was lost and the retry met its own write, or a change adopted the
            # claim (merged): what the log holds is ours. Else a takeover sent it too, and
            # records and counts it: the answer is this request's send.
            kept = self.log.rewrite(ref[0], ref[1], owner, done)
            if kept is None:
                log.warning("run now: its claim was taken over after the send", extra={"pos": pos})
                return timer, pos, done
            done = kept
        if self.usage is not None:  # never fails the request: the fire went
            row = (timer.tenant, pos, done.enqueued or pos, done.state, False, 0)  # at once
            count_fires(self.usage, [row])
        return timer, pos, done

    def _claim(
        self, timer: Timer, cursor_pos: int | None, owner: str, now: int, load: Load
    ) -> tuple[Timer, int, EntryRef, Entry]:
        """Claim a position nobody holds, at ``now`` or just after, in one transaction with
        the timer unchanged: a change (or delete) committed after ``timer`` was read makes it
        fail, and the position is picked again against the timer as it now is."""
        pos = now
        for _ in range(CLAIM_TRIES):
            while pos == cursor_pos or occurs_at(timer, pos):
                pos += 1
            root = ref_of(timer, pos)
            at = self.log.locate([root], consistent=True, learn=True)[root]
            if at.entry is not None:  # another extra fire of this millisecond
                pos += 1
                continue
            if at.count >= self.log.cap:
                self.log.seal(at.key)
                continue
            entry = Entry("p", timer.rev, owner=owner, until=now + EXTRA_CLAIM_MS, end=True)
            try:
                claim = self.log.claim_update(at.key, {root[1]: entry})
                self.timers.transact([self.timers.unchanged_check(timer), claim])
                return timer, pos, (at.key, root[1]), entry
            except ConcurrentUpdate:  # the timer changed, or the position was taken
                timer, cursor_pos = load()
        raise ConcurrentUpdate("no free position for an extra fire; retry")

    def _list(self, timer: Timer, pos: int) -> None:
        """Name the position in the timer's listing (before the send: the history shows a
        fire that was sent), keeping the newest EXTRA_KEPT."""
        key = {"k": {"S": extra_key(timer.partition, timer.id)}}
        ttl = (pos + self.retention_ms) // 1000 + TTL_MARGIN_S
        got = self.log.client.update_item(
            TableName=self.log.table,
            Key=key,
            UpdateExpression=f"ADD #p :p SET {TTL} = :ttl",
            ExpressionAttributeNames={"#p": POSITIONS},
            ExpressionAttributeValues={":p": {"NS": [str(pos)]}, ":ttl": {"N": str(ttl)}},
            ReturnValues="UPDATED_NEW",
        )
        listed = sorted(int(p) for p in got.get("Attributes", {}).get(POSITIONS, {}).get("NS", []))
        if len(listed) > EXTRA_KEPT:
            dropped = [str(p) for p in listed[: len(listed) - EXTRA_KEPT]]
            with contextlib.suppress(ClientError):  # else the next extra fire trims it
                self.log.client.update_item(
                    TableName=self.log.table,
                    Key=key,
                    UpdateExpression="DELETE #p :old",
                    ExpressionAttributeNames={"#p": POSITIONS},
                    ExpressionAttributeValues={":old": {"NS": dropped}},
                )

    def listed(self, timer: Timer) -> list[int]:
        """The positions of the timer's extra fires, newest first."""
        got = self.log.client.get_item(
            TableName=self.log.table, Key={"k": {"S": extra_key(timer.partition, timer.id)}}
        ).get("Item", {})
        return sorted((int(p) for p in got.get(POSITIONS, {}).get("NS", [])), reverse=True)

    def fires(
        self, timer: Timer, below: int | None, limit: int
    ) -> tuple[list[tuple[int, Entry]], int | None]:
        """Up to ``limit`` extra fires before ``below`` (None: all), newest first; and the
        lowest position read if older ones are listed (None: no more)."""
        positions = [p for p in self.listed(timer) if below is None or p < below]
        wanted = positions[:limit]
        refs = {p: ref_of(timer, p) for p in wanted}
        found = self.log.read(refs.values()) if refs else {}
        fires = [(p, e) for p in wanted if (e := found.get(refs[p])) is not None]
        return fires, wanted[-1] if len(positions) > limit else None


def merge(
    chain: Sequence[tuple[int, Entry]],
    chain_more: int | None,
    extras: Sequence[tuple[int, Entry]],
    extras_floor: int | None,
    limit: int,
) -> tuple[list[tuple[int, Entry]], int | None, int]:
    """A page of the history: the newest ``limit`` of a page of chain fires and one of extra
    fires (each newest first); and where the next page goes on - the chain's next position
    (the first of its fires not shown, else ``chain_more``; None: done) and the position extra
    fires must be below (0: none left)."""
    page = sorted([*chain, *extras], key=lambda f: -f[0])[:limit]
    shown = {pos for pos, _ in page}
    unshown = [pos for pos, _ in chain if pos not in shown]
    chain_next = unshown[0] if unshown else chain_more
    # every extra fire above the page's last one is shown
    unshown_extras = any(pos not in shown for pos, _ in extras)
    extras_below = page[-1][0] if unshown_extras else extras_floor or 0
    return page, chain_next, extras_below

"""What the api asks of the fire path: store new timers, derive what a timer shows, and change
one in one transaction ordered with the claim of its cursor - a fence or an adoption (R5 and "A
reset comes after the owed fire" in docs/fire-path.md); a claim that got there first fails the
transaction, and the change starts over from a fresh walk.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol, TypeVar

from timers.core.errors import (
    ConcurrentUpdate,
    FieldError,
    InvalidInput,
    InvalidState,
    NotFound,
)
from timers.core.schedule import is_recurring, next_fire
from timers.core.timer import Timer, with_cursor
from timers.core.times import format_ms
from timers.engine.entries import (
    Cursor,
    Entry,
    drive,
    fence,
    history,
    ref_of,
    resolved,
    settled,
    walk,
)
from timers.engine.index import BucketIndex, Card, member_of
from timers.engine.log import FireLog
from timers.engine.wake import Listing, WakeStore

log = logging.getLogger(__name__)
T = TypeVar("T")
WRITE_ATTEMPTS = 5
CREATE_MS = 60_000
"""A listing younger than this whose timer is absent may belong to a create in flight: six
times the api's timeout, and a create slower than half of it lists its timers again."""
Change = Callable[[Timer, int], Timer]
OWED_POLL_MS = 100
OWED_WAIT_MS = 3_000
"""How long a change that must come after an owed fire (a reset) waits for it: a live run
sends what it claimed within ARM_MS and records it at once; a run that died holds it until its
claim lapses (~33 s), too long for a request - then the change is refused, nothing changed."""


class TimerPort(Protocol):
    """``timers.store.timers_table.TimerStore``."""

    def get(self, tenant: str, timer_id: str, consistent: bool = True) -> Timer | None: ...
    def create(self, timers: Sequence[Timer]) -> None: ...
    def create_guarded(
        self, timers: Sequence[Timer], guard: dict[str, Any], stored: list[Timer]
    ) -> list[Timer]: ...
    def remove_new(self, timers: Sequence[Timer]) -> None: ...
    def change_writes(self, before: Timer, after: Timer | None) -> list[dict[str, Any]]: ...
    def transact(self, writes: Sequence[dict[str, Any]]) -> None: ...
    def checkpoint(self, timer: Timer, pos: int | None, n: int, last: int | None) -> bool: ...
    def complete(self, timer: Timer, n: int, last: int | None, expires_ms: int) -> bool: ...


def listing_of(timer: Timer, pos: int | None = None) -> Listing | None:
    """The wake listing a live timer needs at its checkpoint (or ``pos``)."""
    at = timer.next_fire_ms if pos is None else pos
    live = timer.status == "active" or timer.owed
    return (
        Listing(timer.tenant, timer.id, timer.rev, at, timer.partition)
        if live and at is not None
        else None
    )


def card_of(timer: Timer, cursor: Cursor | None = None) -> Card:
    """The timer's card at its cursor (default: its stored checkpoint, as after a change)."""
    pos, n, last = (
        (timer.next_fire_ms, timer.fire_count, timer.last_fire_pos)
        if cursor is None
        else (cursor.pos, cursor.n, cursor.last)
    )
    assert pos is not None
    return Card(timer, pos, n, last, timer.next_fire_ms or pos)


@dataclass
class Checkpoints:
    """A recurring timer's checkpoint moves: its new listing first, then the timer (R3, R4).
    The listing it had is dead from then on; the migrator deletes it."""

    timers: TimerPort
    wake: WakeStore
    clock: Callable[[], int]

    def move(self, timer: Timer, pos: int, n: int, last: int | None) -> bool:
        listing = Listing(timer.tenant, timer.id, timer.rev, pos, timer.partition)
        self.wake.put(self.wake.items([listing], self.clock()))
        return self.timers.checkpoint(timer, pos, n, last)

    def complete(self, timer: Timer, n: int, last: int | None, expires_ms: int) -> bool:
        return self.timers.complete(timer, n, last, expires_ms)


@dataclass
class Changes:
    timers: TimerPort
    log: FireLog
    wake: WakeStore
    index: BucketIndex | None
    clock: Callable[[], int]
    lookahead_ms: int
    retention_ms: int
    sleep: Callable[[float], None] = time.sleep
    moved: Callable[[str, str, str | None], None] | None = None
    """Told (tenant, status before, after - None: deleted) once a change is committed."""

    # ---------------------------------------------------------------- create

    def store_new(
        self,
        created: Sequence[Timer],
        take_back: bool,
        guard: dict[str, Any] | None = None,
        stored: list[Timer] | None = None,
    ) -> None:
        """Listings first (a listing without its timer is young, then dead: R4), then the
        timers, then the fast path: what is due within the look-ahead goes into Redis now.
        ``take_back``: a failure takes back what was written (new ids: nobody else knows them).
        ``guard`` (a keyed create): each timer stored only if absent and the guard holds, and
        appended to ``stored`` as it is - a keyed create's retry stores only what is missing,
        and a failure midway leaves the caller knowing what it stored."""
        listings = [x for t in created if (x := listing_of(t))]
        listed_at = self.clock()
        if listings:
            self.wake.put(self.wake.items(listings, listed_at))
        try:
            if guard is not None:
                stored = [] if stored is None else stored
                created = self.timers.create_guarded(created, guard, stored)
            else:
                self.timers.create(created)
        except Exception:
            if take_back:
                self.timers.remove_new(created)
            raise
        if listings and self.clock() - listed_at > CREATE_MS // 2:
            # so slow a create may have let the migrator find its listings dead (R4): again
            self.wake.put(self.wake.items(listings, self.clock()))
        self._fast_path([card_of(t) for t in created if self._due_soon(t)])

    # ---------------------------------------------------------------- read

    def walks(self, stored: Sequence[Timer], consistent: bool) -> list[Cursor]:
        return drive([walk(t) for t in stored], lambda refs: self.log.read(refs, consistent))

    def current(self, stored: Timer) -> tuple[Timer, Cursor]:
        """The derived timer and its cursor (consistent reads)."""
        (cursor,) = self.walks([stored], consistent=True)
        return resolved(stored, cursor), cursor

    def fires(
        self, timer: Timer, start: int | None, limit: int
    ) -> tuple[list[tuple[int, Entry]], int | None]:
        """Up to ``limit`` fires newest first from ``start``; and where to go on."""
        [(found, more)] = drive([history(timer, start, limit)], self.log.read)
        return found, more

    # ---------------------------------------------------------------- change

    def change(
        self,
        tenant: str,
        timer_id: str,
        change: Change | None,
        after_owed: bool = False,
        only_if: Callable[[Timer], bool] | None = None,
        read: tuple[Timer, Cursor] | None = None,
    ) -> tuple[Timer, Cursor] | None:
        """Apply ``change`` (None: delete) to the derived timer and commit it in one transaction
        ordered with the claim of its cursor. Returns the timer as stored and what it shows
        (its cursor: an owed fire stays pending until recorded); None once deleted.
        ``after_owed``: a claimed fire is waited for, not adopted (a reset). ``only_if``: a
        timer it is false of is NotFound, checked on the revision the change commits against.
        ``read``: the first attempt's read, made by the caller for many timers at once (a
        group operation: docs/fire-path.md)."""
        for attempt in range(WRITE_ATTEMPTS):
            try:
                first = read if attempt == 0 and not after_owed else None
                return self._attempt(tenant, timer_id, change, after_owed, only_if, first)
            except ConcurrentUpdate:
                if attempt + 1 == WRITE_ATTEMPTS:
                    raise
        raise AssertionError("unreachable")

    def _read_settled(self, tenant: str, timer_id: str, after_owed: bool) -> tuple[Timer, Cursor]:
        """The stored timer and its cursor; with ``after_owed``, once no fire is owed."""
        for _ in range(OWED_WAIT_MS // OWED_POLL_MS + 1):
            stored = self.timers.get(tenant, timer_id)
            if stored is None:
                raise NotFound(f"no timer {timer_id!r}")
            _, cursor = self.current(stored)
            if not after_owed or cursor.pending is None:
                return stored, cursor
            self.sleep(OWED_POLL_MS / 1000)
        raise InvalidState("a fire of this timer is being sent; try again in a few seconds")

    def _attempt(
        self,
        tenant: str,
        timer_id: str,
        change: Change | None,
        after_owed: bool,
        only_if: Callable[[Timer], bool] | None = None,
        read: tuple[Timer, Cursor] | None = None,
    ) -> tuple[Timer, Cursor] | None:
        stored, cursor = read or self._read_settled(tenant, timer_id, after_owed)
        if only_if is not None and not only_if(stored):
            raise NotFound(f"no timer {timer_id!r} here")
        base = settled(stored, cursor)  # as if the owed fire, if any, had finished
        now = self.clock()
        fired = self._last_fired(stored, cursor) if after_owed else None
        if fired is not None:  # a restart comes after the last fire: none of its ids again
            now = max(now, fired + 1)
        after = None if change is None else change(base, now)
        if after is not None and after == base:
            return stored, cursor
        rev = stored.rev + 1
        if after is not None:
            after = replace(after, rev=rev, owed=False)
            if after.anchor_ms != base.anchor_ms:  # a new schedule
                if not after_owed:
                    fired = self._last_fired(stored, cursor)
                after = self._first_unclaimed(after, fired)
        owed, pos = cursor.pending, cursor.pos
        writes: list[dict[str, Any]] = []
        kept = after
        if owed is not None and pos is not None:
            # adopted by the new revision (a delete's: the chain ends there, so no stale card
            # chains past it); a deleted timer's owed fire goes if its claimant lives
            adopted = (
                _adopted(owed, after) if after else replace(owed, rev=rev, next=None, end=True)
            )
            ref = ref_of(stored, pos)
            writes.append(self.log.adopt_update(ref, adopted, owed))
            if after is not None:
                # the checkpoint stays on the owed fire until it is recorded (R3); the timer
                # stays live and findable meanwhile (R4)
                kept = replace(
                    after,
                    next_fire_ms=pos,
                    fire_count=cursor.n,
                    last_fire_pos=cursor.last,
                    owed=after.status != "active",
                    status="active" if after.status == "completed" else after.status,
                )
        elif pos is not None:
            writes.append(self.log.fence_update(ref_of(stored, pos), fence(rev)))
        if kept is not None:
            kept = self.with_expiry(kept, now, later=after)
            if listing := listing_of(kept):
                writes += [
                    {"Put": {"TableName": self.wake.table, "Item": self.wake.serialize(item)}}
                    for item in self.wake.items([listing], now)
                ]
        writes[:0] = self.timers.change_writes(stored, kept)
        self.timers.transact(writes)
        self._sync(stored, kept, rev, adopted=owed is not None)
        if self.moved is not None:  # after the fast path: counting never delays a fire
            # from the status shown before, an owed fire still active: a last fire adopted
            # here is the change's to count (its run sees the change's revision and does not)
            before = resolved(stored, cursor).status
            self.moved(tenant, before, None if after is None else after.status)
        if kept is None:
            return None
        return kept, Cursor(kept.next_fire_ms, kept.fire_count, kept.last_fire_pos, owed)

    def _last_fired(self, stored: Timer, cursor: Cursor) -> int | None:
        """The latest occurrence the timer fired (or owes): a misfire catch-up fires a later
        occurrence than its position, so it is read from the entries."""
        times = []
        if cursor.pending is not None and cursor.pos is not None:
            times.append(cursor.pending.fired or cursor.pos)
        if cursor.last is not None:
            ref = ref_of(stored, cursor.last)
            entry = self.log.read([ref], consistent=True)[ref]
            times.append(entry.fired if entry is not None and entry.fired else cursor.last)
        return max(times, default=None)

    def _first_unclaimed(self, timer: Timer, fired: int | None) -> Timer:
        """A new schedule starts after the last occurrence fired and at a position the timer
        never claimed (fire ids are ``<timer>:<occurrence>``): a recurring one moves on; a
        one-shot at such a time is refused."""
        for _ in range(WRITE_ATTEMPTS):
            pos = timer.next_fire_ms
            if pos is None:
                return timer
            found = None
            if fired is None or pos > fired:
                ref = ref_of(timer, pos)
                found = self.log.read([ref], consistent=True)[ref]
                if found is None or found.state == "t":
                    return timer
            if not is_recurring(timer.schedule):
                raise InvalidInput(
                    "the timer already fired at or after that time",
                    [FieldError("schedule", f"{format_ms(pos)} is not after its last fire")],
                )
            timer = with_cursor(timer, next_fire(timer.plan, max(pos, fired or pos)))
        raise ConcurrentUpdate("the new schedule's first occurrences are all claimed")

    def _sync(self, before: Timer, after: Timer | None, rev: int, adopted: bool) -> None:
        """Keep Redis in step with a committed change; DynamoDB stays the truth if Redis is
        unreachable (the fence already stops the old card; the listing brings the new one). An
        adopted change keeps the card's position and lease: the owed fire's run sends it and
        chains the new revision; any other new card is leasable at once."""
        if self.index is None:
            return
        try:
            if after is not None and self._due_soon(after):
                self.index.put([card_of(after)], keep_lease=adopted)
            else:
                self.index.drop(before.partition, member_of(before.tenant, before.id), rev)
        except Exception:
            log.warning("fast path failed; the migrator will catch up", exc_info=True)

    def _fast_path(self, cards: Sequence[Card]) -> None:
        if cards and self.index is not None:
            try:
                self.index.put(cards)
            except Exception:  # the migrator puts them in from their listings; only time lost
                log.warning("fast path failed; the migrator will catch up", exc_info=True)

    def _due_soon(self, timer: Timer) -> bool:
        due = timer.next_fire_ms
        return (
            due is not None
            and (timer.status == "active" or timer.owed)
            and due <= self.clock() + self.lookahead_ms
        )

    def with_expiry(self, timer: Timer, now: int, later: Timer | None = None) -> Timer:
        """When the timer is deleted (TTL): a one-shot ``retention`` after it fires (its due
        time, or now if that passed; ``later``: the re-armed one-shot after an owed fire); a
        timer completed by a change ``retention`` from now; others never."""
        if timer.status == "completed":
            return replace(timer, expires_ms=now + self.retention_ms)
        dues = [t.next_fire_ms for t in (timer, later) if t is not None and t.status == "active"]
        due = max((d for d in dues if d is not None), default=None)
        if timer.status == "active" and due is not None and not is_recurring(timer.schedule):
            return replace(timer, expires_ms=max(due, now) + self.retention_ms)
        return replace(timer, expires_ms=None)


def _adopted(owed: Entry, after: Timer) -> Entry:
    """A pending entry handed to the change's revision: its successor is the change's next
    position (a pause leaves it be: nothing chains a paused timer)."""
    if after.status == "paused":
        return replace(owed, rev=after.rev)
    following = after.next_fire_ms if after.status == "active" else None
    return replace(owed, rev=after.rev, next=following, end=following is None)

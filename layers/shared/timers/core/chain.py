"""A timer's fires as a chain of claim entries: the pure rules of the fire path.

Each occurrence a timer reaches is one *position* of its chain. A trigger claims a position
(one entry in the claim item of its bucket and second), fires or skips it, and chains the next
position. A timer's stored item holds only a checkpoint; what it shows - fire count, next fire,
completed - is derived by walking the entries from that checkpoint (:func:`walk`). Nothing here
does I/O: the walk is a generator that asks its driver for entries (see ``drive``).

Terms: ``pos`` is a position (an occurrence of the plan, epoch ms); ``n`` counts fires.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal, TypeVar

from timers.core.schedule import Plan, catch_up, is_recurring, next_fire
from timers.core.timer import Timer

CHECKPOINT_EVERY = 128
"""A chained timer's checkpoint moves every this many fires, so the fires after a checkpoint
are at most this many positions of the plan: a walk is a binary search of <= 8 reads."""

HOLD_MS = 65 * 60_000
"""A finished position chains its successor in Redis when that is due within this long: an
hourly timer stays chained - no checkpoint write and no migrator restore per fire; only a
chain that leaves Redis moves its checkpoint. Redis holds at most about an hour ahead."""


def hold_ms(lookahead_ms: int, retention_ms: int) -> int:
    """How far ahead a chain stays in Redis: HOLD_MS, never less than the look-ahead, and short
    enough that a walk from a checkpoint (CHECKPOINT_EVERY positions) spans at most half the
    claim entries' retention - they must still be there to be read."""
    return max(lookahead_ms, min(HOLD_MS, retention_ms // (2 * CHECKPOINT_EVERY)))


MISFIRE_GRACE_MS = 45_000
"""A cursor less than this behind now is merely late and fires as scheduled whatever the
timer's misfire policy; older is an outage and the policy decides. It exceeds the slowest
recovery of our own (a killed trigger's work returns about 32 s later)."""

LAPSE_MARGIN_MS = 2_000
"""A pending claim counts as lapsed only this long after its ``until``: the clocks of the hosts
that compare it may differ by this much."""

State = Literal["p", "d", "f", "k", "t"]
"""pending (claimed, being sent) | sent | failed | skipped by misfire | tombstone"""

# ---------------------------------------------------------------- members and keys


@dataclass(frozen=True, order=True)
class Member:
    """One position of one timer as it sits in Redis: ``tenant|timer|due|rev|n|pv``.

    ``n`` counts the fires before this position; ``pv`` is the position before it (history).
    """

    tenant: str
    timer_id: str
    due: int
    rev: int
    n: int
    pv: int | None = None

    def __str__(self) -> str:
        pv = "" if self.pv is None else str(self.pv)
        return f"{self.tenant}|{self.timer_id}|{self.due}|{self.rev}|{self.n}|{pv}"

    @classmethod
    def parse(cls, text: str) -> Member:
        tenant, timer_id, due, rev, n, pv = text.split("|")
        return cls(tenant, timer_id, int(due), int(rev), int(n), int(pv) if pv else None)


def check_name(value: str, what: str) -> None:
    """Tenant names and timer ids are member fields: they must not contain '|' or '@'."""
    if not value or "|" in value or "@" in value:
        raise ValueError(f"{what} must be non-empty without '|' or '@': {value!r}")


PARTITIONS = 4_096
"""Claim partitions. A timer belongs to one (fixed at its creation); its claim entries live in
the item of its partition and second, and its Redis bucket is ``partition % BucketCount``.
Never change it on a live deployment: it is part of every claim item's key."""


def claim_key(partition: int, pos: int) -> str:
    """The claim item holding ``pos``: one per partition and second."""
    return f"{partition}/{pos // 1000}"


def entry_name(timer_id: str, pos: int) -> str:
    """The entry's attribute name in its claim item: a function of (timer, position) only."""
    return f"{timer_id}@{pos % 1000:03d}"


EntryRef = tuple[str, str]  # (claim key, entry name)


def entry_ref(partition: int, timer_id: str, pos: int) -> EntryRef:
    return claim_key(partition, pos), entry_name(timer_id, pos)


def partition_for(tenant: str, timer_id: str, spread: int) -> int:
    """A tenant's timers share ``spread`` consecutive partitions from ``crc32(tenant)`` (crc32
    is the same in every process). So one tenant's burst occupies at most ``spread`` Redis
    buckets and claim items per second - its runs, and the size of its claim writes - and other
    tenants' timers sit in items of their own."""
    home = zlib.crc32(tenant.encode()) % PARTITIONS
    width = max(1, min(spread, PARTITIONS))
    return (home + zlib.crc32(timer_id.encode()) % width) % PARTITIONS


# ---------------------------------------------------------------- claim entries


@dataclass(frozen=True)
class Entry:
    """One position's entry in a claim item (see docs/fire-path.md, "the claim item")."""

    state: State
    rev: int
    n: int = 0  # fires including this one (a skip leaves the count)
    pv: int | None = None  # the chain position before this one
    owner: str | None = None  # pending: the claimant's token
    until: int | None = None  # pending: the claim holds until then
    enqueued: int | None = None  # sent/failed: when
    reason: str | None = None  # failed: why
    fired: int | None = None  # the occurrence fired, when not the position itself (misfire)
    next: int | None = None  # the next position, when not the plan's next (misfire jump)
    end: bool = False  # the chain ends here: the timer is done
    hook: bool = False  # sent to an HTTP target (the delivery queue): see delivery records

    def lapsed(self, now_ms: int) -> bool:
        return self.state == "p" and (self.until or 0) < now_ms - LAPSE_MARGIN_MS

    def holds(self, now_ms: int) -> bool:
        """Whether this entry claims its position: a tombstone or a lapsed claim does not."""
        return self.state != "t" and not self.lapsed(now_ms)

    @property
    def is_fire(self) -> bool:
        return self.state in ("p", "d", "f")

    @property
    def finished(self) -> bool:
        """Sent, failed or skipped: nothing is left to do for the position but chain it."""
        return self.state in ("d", "f", "k")


def tombstone(rev: int) -> Entry:
    """A fence: forbids members of revisions below ``rev`` to claim the position."""
    return Entry("t", rev)


Action = Literal["claim", "take_over", "ours", "wait", "done", "stale"]
"""What a member does with the entry it finds at its position (:func:`decide_claim`)."""


def decide_claim(
    existing: Entry | None, *, rev: int, fresh: bool, owner: str, now_ms: int
) -> Action:
    """The rules of who may claim a position (docs/fire-path.md, R1 and R2).

    Only a *fresh* member (of the timer's current revision, the timer active) creates a claim,
    over an absent entry or a fence of a revision not newer than its own. Any member takes over
    a pending claim that lapsed (its run is gone; the claimed fire is owed), waits for a live
    one, and only acknowledges a finished one. Anything else is stale.
    """
    if existing is None:
        return "claim" if fresh else "stale"
    if existing.state == "t":
        return "claim" if fresh and rev >= existing.rev else "stale"
    if existing.finished:
        return "done"
    if existing.owner == owner:
        return "ours"
    return "take_over" if existing.lapsed(now_ms) else "wait"


def successor(entry: Entry, pos: int, plan: Plan) -> int | None:
    """The chain position after a claimed ``pos``: the entry's own decision (``nx``, ``end``),
    else the plan's next occurrence."""
    if entry.end:
        return None
    if entry.next is not None:
        return entry.next
    return next_fire(plan, pos) if is_recurring(plan.schedule) else None


# ---------------------------------------------------------------- what a trigger does


@dataclass(frozen=True)
class Step:
    """What firing one member does: the occurrence to send, the count, where the chain goes."""

    fire_ms: int | None  # the occurrence to send now; None: skipped by the misfire policy
    n: int  # fires including this one
    next_pos: int | None  # the next position; None: the timer is done
    jump: bool  # the chain leaves the plan's order here (a misfire decision)


def step(timer: Timer, member: Member, now_ms: int, grace_ms: int = MISFIRE_GRACE_MS) -> Step:
    """Decide a due member: fire it (after an outage: what the misfire policy says) and where
    the chain goes next. Never an occurrence after ``now_ms``."""
    pos = member.due
    if pos > now_ms:
        raise ValueError(f"position {pos} is not due at {now_ms}: never fire early")
    decision = catch_up(timer.plan, pos, now_ms, timer.misfire, grace_ms)
    n = member.n + (decision.fire_ms is not None)
    following = decision.next_cursor_ms
    if timer.max_fires is not None and n >= timer.max_fires:
        following = None
    return Step(decision.fire_ms, n, following, jump=decision.fire_ms != pos)


def entry_for(decided: Step, member: Member, owner: str, until: int) -> Entry:
    """The pending entry that claims ``member``'s position for the ``decided`` step."""
    fired = decided.fire_ms
    return Entry(
        "p" if fired is not None else "k",
        member.rev,
        n=decided.n,
        pv=member.pv,
        owner=owner,
        until=until,
        fired=fired if fired is not None and fired != member.due else None,
        next=decided.next_pos if decided.jump else None,
        end=decided.next_pos is None,
    )


def next_member(member: Member, entry: Entry, plan: Plan) -> Member | None:
    """The member after a claimed position, read from its entry (so a takeover, which did not
    decide the step itself, chains exactly as the first claimant would have). It belongs to the
    entry's revision (a change may have adopted the position): ``plan`` must be that revision's.
    """
    following = successor(entry, member.due, plan)
    if following is None:
        return None
    return Member(member.tenant, member.timer_id, following, entry.rev, entry.n, member.due)


def needs_checkpoint(entry: Entry, chained: bool) -> bool:
    """Whether finishing a position must first move the timer's checkpoint: when the timer is
    done, when the chain leaves Redis (its next position is beyond HOLD_MS), after a misfire
    jump, and every CHECKPOINT_EVERY fires."""
    return (
        entry.end
        or not chained
        or entry.next is not None
        or (entry.is_fire and entry.n % CHECKPOINT_EVERY == 0)
    )


# ---------------------------------------------------------------- walks


@dataclass(frozen=True)
class Cursor:
    """A timer's derived state: the first chain position not finished, the fires before it,
    the last finished position, and - when the cursor is claimed and not yet finished - its
    pending entry (an owed fire: R2 says there is at most one)."""

    pos: int | None  # None: nothing left to fire (completed)
    n: int
    last: int | None  # the last finished position (its history starts there)
    pending: Entry | None = None


Want = list[EntryRef]
Got = Mapping[EntryRef, "Entry | None"]
T = TypeVar("T")
Reads = Generator[Want, Got, T]


def positions(plan: Plan, first: int | None, count: int) -> list[int]:
    """Up to ``count`` positions of the plan from ``first`` on, in the plan's own order."""
    out: list[int] = []
    pos = first
    while pos is not None and len(out) < count:
        out.append(pos)
        pos = next_fire(plan, pos) if is_recurring(plan.schedule) else None
    return out


def walk(timer: Timer) -> Reads[Cursor]:
    """From the timer's checkpoint to its cursor, asking for entries as it goes.

    Finished positions after a checkpoint are a prefix of its chain, and the chain follows the
    plan's positions except where an entry's ``nx`` jumps (R1-R3 and the lemma in
    docs/fire-path.md): a binary search over the plan's next positions finds where the prefix
    ends, and a jump found there is followed. Whatever the timer's status: a paused timer's
    cursor is where it will resume, and an owed fire claimed before the pause shows as pending.
    """
    pos, n, last = timer.next_fire_ms, timer.fire_count, timer.last_fire_pos
    while pos is not None:
        # max_fires reached: nothing new may be claimed, but a fire claimed before a change
        # lowered max_fires (adopted, and the checkpoint kept on it) still counts once finished
        spent = timer.max_fires is not None and n >= timer.max_fires
        window = positions(timer.plan, pos, 1 if spent else CHECKPOINT_EVERY + 1)
        refs = [entry_ref(timer.partition, timer.id, p) for p in window]
        entries: dict[int, Entry | None] = {}
        lo, hi = -1, len(window)  # window[lo] is finished, window[hi] is not
        while hi - lo > 1:
            mid = (lo + hi) // 2
            got = yield [refs[mid]]
            entries[mid] = got.get(refs[mid])
            entry = entries[mid]
            lo, hi = (mid, hi) if entry is not None and entry.finished else (lo, mid)
        if lo < 0:
            owed = _pending(entries.get(0))
            return Cursor(None, n, last) if spent and owed is None else Cursor(pos, n, last, owed)
        done = entries[lo]
        assert done is not None
        n, last = done.n, window[lo]
        following = successor(done, window[lo], timer.plan)
        if done.next is None and following is not None and hi < len(window):
            return Cursor(following, n, last, _pending(entries[hi]))  # window[hi] = following
        pos = following
    return Cursor(None, n, last)


def _pending(entry: Entry | None) -> Entry | None:
    return entry if entry is not None and entry.state == "p" else None


def resolved(timer: Timer, cursor: Cursor) -> Timer:
    """The timer as a user sees it: the derived cursor and count (a pending fire counts once it
    is recorded); an active timer with nothing left is completed."""
    if timer.status == "completed":
        return replace(timer, next_fire_ms=None)
    done = timer.status == "active" and cursor.pos is None
    return replace(
        timer,
        next_fire_ms=cursor.pos,
        fire_count=cursor.n,
        last_fire_pos=cursor.last,
        status="completed" if done else timer.status,
    )


def settled(timer: Timer, cursor: Cursor) -> Timer:
    """The derived timer as if its owed (pending) fire had finished: the starting point of a
    change, which is ordered after that claim (R5). Without a pending fire, :func:`resolved`."""
    shown = resolved(timer, cursor)
    owed, pos = cursor.pending, cursor.pos
    if owed is None or pos is None:
        return shown
    following = successor(owed, pos, timer.plan) if owed.rev == timer.rev else owed.next
    return replace(
        shown,
        next_fire_ms=following,
        fire_count=owed.n,
        last_fire_pos=pos,
        status="completed" if timer.status == "active" and following is None else shown.status,
    )


def history(
    partition: int, timer_id: str, start: int | None, limit: int
) -> Reads[tuple[list[tuple[int, Entry]], int | None]]:
    """Up to ``limit`` fires, newest first, from position ``start`` back along ``pv``; also the
    position to continue from (None: no older entry)."""
    fires: list[tuple[int, Entry]] = []
    pos = start
    while pos is not None and len(fires) < limit:
        ref = entry_ref(partition, timer_id, pos)
        entry = (yield [ref]).get(ref)
        if entry is None:
            return fires, None
        if entry.is_fire:
            fires.append((pos, entry))
        pos = entry.pv
    return fires, pos


def drive(reads: Iterable[Reads[T]], read: Callable[[Sequence[EntryRef]], Got]) -> list[T]:
    """Run several walks side by side: each round reads what every unfinished one wants in one
    call of ``read`` (a batch read), so N timers cost ~8 reads, not 8 N."""
    waiting: dict[int, tuple[Reads[T], Want]] = {}
    results: dict[int, T] = {}
    for i, gen in enumerate(reads):
        try:
            waiting[i] = (gen, next(gen))
        except StopIteration as stop:
            results[i] = stop.value
    while waiting:
        answers = read(sorted({ref for _, want in waiting.values() for ref in want}))
        for i, (gen, _) in list(waiting.items()):
            try:
                waiting[i] = (gen, gen.send(answers))
            except StopIteration as stop:
                results[i] = stop.value
                del waiting[i]
    return [results[i] for i in sorted(results)]

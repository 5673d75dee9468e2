"""A timer's fires as a chain of fire-log entries: the pure rules of the fire path (its terms
and rules R1-R5: "Never lost, once, on time" in docs/fire-path.md). The stored timer holds only
a checkpoint; what it shows is derived by walking the entries from there (:func:`walk`). No I/O
here: a walk is a generator that asks its driver (:func:`drive`) for entries.
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal, TypeVar

from timers.core.schedule import Plan, catch_up, is_recurring, next_fire
from timers.core.timer import Timer
from timers.core.window import aligned

CHECKPOINT_EVERY = 128
"""A chained timer's checkpoint moves every this many fires: a walk is <= 8 reads."""
HOLD_MS = 65 * 60_000
"""A position due this soon after the one just fired stays in Redis (no checkpoint write)."""
MISFIRE_GRACE_MS = 45_000
"""A cursor less than this behind now is merely late and fires whatever the misfire policy:
longer than the slowest recovery of our own (a killed run's work returns ~33 s later)."""
LAPSE_MARGIN_MS = 2_000
"""A pending claim lapses this long after its ``until``: hosts' clocks may differ so much."""
PARTITIONS = 4_096
"""Claim partitions: a timer's is fixed at its creation, its bucket is ``partition % buckets``.
Part of every fire-log key: never change it on a live deployment."""

State = Literal["p", "d", "f", "k", "t"]
"""pending (claimed, being sent) | sent | failed | skipped by misfire | fence"""
EntryRef = tuple[str, str]  # (fire-log item key, entry name)
Action = Literal["claim", "take_over", "ours", "wait", "done", "stale"]


def hold_ms(lookahead_ms: int, retention_ms: int) -> int:
    """HOLD_MS, never below the look-ahead, and short enough that a walk from a checkpoint
    (CHECKPOINT_EVERY positions) spans at most half the entries' retention."""
    return max(lookahead_ms, min(HOLD_MS, retention_ms // (2 * CHECKPOINT_EVERY)))


def claim_second(partition: int, pos: int, grain_ms: int = 0) -> int:
    """The second whose fire-log item holds a position's entry: the position's own, or - a
    timer with a window's grain - that of the aligned instant its fire is sent at, so that an
    instant's fires of the partition share one item (timers.core.window)."""
    return aligned(pos, grain_ms, partition) // 1000


def entry_ref(partition: int, timer_id: str, pos: int, grain_ms: int = 0) -> EntryRef:
    """A function of (timer, position) only - the grain is fixed at the timer's creation -
    so whoever claims a position meets the same entry: ``<partition>/<second>`` and
    ``<timer>@<ms from that second>`` (negative for a windowed fire due before it)."""
    second = claim_second(partition, pos, grain_ms)
    return f"{partition}/{second}", f"{timer_id}@{pos - second * 1000:03d}"


def path_hash(timer_id: str) -> str:
    """The digits that place a timer's entries below sealed fire-log items (``log.child_key``)
    and order an aligned instant's crowd in Redis (``Card.score``): leased in that order, the
    crowd fills one claim item after another."""
    return hashlib.blake2b(timer_id.encode(), digest_size=8).hexdigest()


def ref_of(timer: Timer, pos: int) -> EntryRef:
    return entry_ref(timer.partition, timer.id, pos, timer.grain_ms)


WINDOW_SPREAD = 1
"""A timer with a window shares its tenant's home partition with the tenant's other windowed
timers: their fires meet in one bucket, one run and one claim item per aligned instant."""


def spread_of(spread: int, timer: Timer) -> int:
    """The partitions a timer may land in: its tenant's spread, or WINDOW_SPREAD with a grain."""
    return min(spread, WINDOW_SPREAD) if timer.grain_ms else spread


def partition_for(tenant: str, timer_id: str, spread: int) -> int:
    """A tenant's timers share ``spread`` consecutive partitions from ``crc32(tenant)``: one
    tenant's burst occupies at most that many buckets, and others' timers sit elsewhere."""
    home = zlib.crc32(tenant.encode()) % PARTITIONS
    width = max(1, min(spread, PARTITIONS))
    return (home + zlib.crc32(timer_id.encode()) % width) % PARTITIONS


@dataclass(frozen=True)
class Entry:
    """One position's entry in the fire log (docs/fire-path.md, "Data model")."""

    state: State
    rev: int
    n: int = 0  # fires including this one (a skip leaves the count)
    pv: int | None = None  # the chain position before this one
    owner: str | None = None  # pending: the claimant's token
    until: int | None = None  # pending: the claim holds until then
    enqueued: int | None = None  # sent/failed: when
    reason: str | None = None  # failed: why
    fired: int | None = None  # the occurrence fired, when not the position (misfire)
    next: int | None = None  # the next position, when not the plan's next (misfire, adoption)
    end: bool = False  # the chain ends here
    hook: bool = False  # sent to an HTTP target: it has a delivery record

    @property
    def lapses_at(self) -> int:  # a claim's first instant taken over: claim.py waits for it too
        return (self.until or 0) + LAPSE_MARGIN_MS + 1

    @property
    def is_fire(self) -> bool:
        return self.state in ("p", "d", "f")

    @property
    def finished(self) -> bool:
        return self.state in ("d", "f", "k")


def fence(rev: int) -> Entry:
    """Forbids cards of revisions below ``rev`` to claim the position."""
    return Entry("t", rev)


def decide_claim(
    existing: Entry | None, *, rev: int, fresh: bool, owner: str, now_ms: int
) -> Action:
    """Who may claim a position (R1, R2): only a *fresh* card claims - over nothing or a fence
    of no newer revision; anyone takes over a lapsed claim (the fire is owed), waits for a live
    one, acknowledges a finished one."""
    if existing is None:
        return "claim" if fresh else "stale"
    if existing.state == "t":
        return "claim" if fresh and rev >= existing.rev else "stale"
    if existing.finished:
        return "done"
    if existing.owner == owner:
        return "ours"
    return "take_over" if existing.lapses_at <= now_ms else "wait"


def successor(entry: Entry, pos: int, plan: Plan) -> int | None:
    """The chain position after a claimed ``pos``: the entry's own decision, else the plan's."""
    if entry.end:
        return None
    if entry.next is not None:
        return entry.next
    return next_fire(plan, pos) if is_recurring(plan.schedule) else None


@dataclass(frozen=True)
class Step:
    """What firing a position does: the occurrence sent, the count, where the chain goes."""

    fire_ms: int | None  # None: skipped by the misfire policy
    n: int  # fires including this one
    next_pos: int | None  # None: the timer is done
    jump: bool  # the chain leaves the plan's order here (a misfire decision)


def misfire_grace_ms(timer: Timer) -> int:
    """How late a position may be decided and still be merely late: MISFIRE_GRACE_MS after the
    end of the timer's window (a fire anywhere in its window is on time)."""
    return MISFIRE_GRACE_MS + timer.window_ms


def step(timer: Timer, pos: int, n: int, now_ms: int, grace_ms: int = MISFIRE_GRACE_MS) -> Step:
    """Decide a due position (after an outage: what the misfire policy says). Never a fire
    after ``now_ms``."""
    if pos > now_ms:
        raise ValueError(f"position {pos} is not due at {now_ms}: never fire early")
    decision = catch_up(timer.plan, pos, now_ms, timer.misfire, grace_ms)
    count = n + (decision.fire_ms is not None)
    following = decision.next_cursor_ms
    if timer.max_fires is not None and count >= timer.max_fires:
        following = None
    return Step(decision.fire_ms, count, following, jump=decision.fire_ms != pos)


def entry_for(decided: Step, rev: int, pos: int, pv: int | None, owner: str, until: int) -> Entry:
    """The pending (or skipped) entry that claims ``pos`` for the ``decided`` step."""
    fired = decided.fire_ms
    return Entry(
        "p" if fired is not None else "k",
        rev,
        n=decided.n,
        pv=pv,
        owner=owner,
        until=until,
        fired=fired if fired is not None and fired != pos else None,
        next=decided.next_pos if decided.jump else None,
        end=decided.next_pos is None,
    )


def needs_checkpoint(entry: Entry, chained: bool) -> bool:
    """Finishing a position moves the checkpoint first: when the timer is done, when its chain
    leaves Redis, after a misfire jump, and every CHECKPOINT_EVERY fires."""
    return (
        entry.end
        or not chained
        or entry.next is not None
        or (entry.is_fire and entry.n % CHECKPOINT_EVERY == 0)
    )


# ---------------------------------------------------------------- walks


@dataclass(frozen=True)
class Cursor:
    """A timer's derived state: the first chain position not finished (None: completed), the
    fires before it, the last finished position, and its pending entry if claimed (owed)."""

    pos: int | None
    n: int
    last: int | None
    pending: Entry | None = None


Want = list[EntryRef]
Got = Mapping[EntryRef, "Entry | None"]
T = TypeVar("T")
Reads = Generator[Want, Got, T]


def positions(plan: Plan, first: int | None, count: int) -> list[int]:
    out: list[int] = []
    pos = first
    while pos is not None and len(out) < count:
        out.append(pos)
        pos = next_fire(plan, pos) if is_recurring(plan.schedule) else None
    return out


def walk(timer: Timer) -> Reads[Cursor]:
    """From the checkpoint to the cursor: a binary search over the plan's positions, following
    a jump (``nx``) where it meets one (the lemma in docs/fire-path.md). Whatever the status: a
    paused timer's cursor is where it resumes, and a fire claimed before the pause is pending."""
    pos, n, last = timer.next_fire_ms, timer.fire_count, timer.last_fire_pos
    while pos is not None:
        # max_fires reached: nothing new is claimed, but a fire claimed before a change lowered
        # it (adopted, the checkpoint kept on it) still counts once finished
        spent = timer.max_fires is not None and n >= timer.max_fires
        window = positions(timer.plan, pos, 1 if spent else CHECKPOINT_EVERY + 1)
        refs = [ref_of(timer, p) for p in window]
        entries: dict[int, Entry | None] = {}
        lo, hi = -1, len(window)  # window[lo] is finished, window[hi] is not
        while hi - lo > 1:
            mid = (lo + hi) // 2
            entries[mid] = (yield [refs[mid]]).get(refs[mid])
            done = entries[mid]
            lo, hi = (mid, hi) if done is not None and done.finished else (lo, mid)
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
    """The timer as a user sees it; an active timer with nothing left is completed."""
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
    """The derived timer as if its owed fire had finished: where a change starts (R5)."""
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
    timer: Timer, start: int | None, limit: int
) -> Reads[tuple[list[tuple[int, Entry]], int | None]]:
    """Up to ``limit`` fires, newest first, back along ``pv`` from ``start``; and where to
    continue (None: no older entry)."""
    fires: list[tuple[int, Entry]] = []
    pos = start
    while pos is not None and len(fires) < limit:
        ref = ref_of(timer, pos)
        entry = (yield [ref]).get(ref)
        if entry is None:
            return fires, None
        if entry.is_fire:
            fires.append((pos, entry))
        pos = entry.pv
    return fires, pos


def drive(reads: Iterable[Reads[T]], read: Callable[[Sequence[EntryRef]], Got]) -> list[T]:
    """Run walks side by side: each round reads what every unfinished one wants in one call."""
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

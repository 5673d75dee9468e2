"""The fire path's pure rules (``timers.engine.entries``): fire-log entries, who may claim, the
step decision, chaining, checkpoints, walks and history.

The property tests run whole chains of fires in memory, as triggers would: each card claims its
position, the misfire policy decides after an outage, the card moves to ``successor()`` with
``Card.at()``, and the checkpoint moves where the rules say. Walking the entries from a
checkpoint must then find the cursor (the lemma of docs/fire-path.md), and the view it derives
must be what the first edition's state machine (``timers.core.timer.advance``, which rewrote
the timer on every fire) showed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.support.clock import T0
from timers.core import timer as timers
from timers.core.schedule import (
    AtSchedule,
    CronSchedule,
    EverySchedule,
    Misfire,
    Schedule,
    catch_up,
    next_fire,
)
from timers.core.timer import Timer
from timers.core.window import aligned
from timers.engine.entries import (
    CHECKPOINT_EVERY,
    HOLD_MS,
    LAPSE_MARGIN_MS,
    MISFIRE_GRACE_MS,
    PARTITIONS,
    Cursor,
    Entry,
    EntryRef,
    State,
    decide_claim,
    drive,
    entry_for,
    entry_ref,
    fence,
    history,
    hold_ms,
    needs_checkpoint,
    partition_for,
    positions,
    resolved,
    settled,
    step,
    successor,
    walk,
)
from timers.engine.index import Card

LOOKAHEAD_MS = 120_000


def _timer(**fields: Any) -> Timer:
    fields.setdefault("payload_json", "null")
    created = timers.create("acme", "tmr_x", target_queue_url="q", now_ms=T0, **fields)
    return replace(created, rev=1, partition=7)


def _head(timer: Timer) -> Card:
    """The card a timer's checkpoint stands for."""
    assert timer.next_fire_ms is not None
    return Card(timer, timer.next_fire_ms, timer.fire_count, timer.last_fire_pos)


def _claim(timer: Timer, card: Card, now: int, owner: str = "o") -> Entry:
    """The entry a run claims ``card``'s position with at ``now`` (valid 30 s)."""
    decided = step(timer, card.pos, card.n, now)
    return entry_for(decided, timer.rev, card.pos, card.pv, owner, now + 30_000)


def _finished(entry: Entry, at: int) -> Entry:
    """The claim as its run records it: sent, or skipped by the misfire policy."""
    return replace(
        entry, state="k" if entry.state == "k" else "d", owner=None, until=None, enqueued=at
    )


def _next_card(card: Card, entry: Entry, timer: Timer) -> Card | None:
    """Where the chain goes after ``card``'s position: ``successor()`` moved by ``Card.at()``."""
    following = successor(entry, card.pos, timer.plan)
    return None if following is None else card.at(following, entry.n, card.pos)


# ---------------------------------------------------------------- names and keys


def test_an_entry_is_keyed_by_partition_second_and_timer_ms() -> None:
    assert entry_ref(7, "tmr_x", T0 + 1_234) == (f"7/{(T0 + 1_234) // 1000}", "tmr_x@234")
    assert entry_ref(7, "tmr_x", T0 + 5) == (f"7/{T0 // 1000}", "tmr_x@005")


def test_a_windowed_timers_entries_live_in_the_item_of_their_aligned_instant() -> None:
    """With a grain (a window at creation) a position's entry lives in the item of the second
    its fire is sent at, named by its ms from that second: the fires of a partition due within
    one grain share an item, and every position of the timer has a name of its own."""
    grain, part = 30_000, 7
    sent = aligned(T0 + 1_234, grain, part)
    assert T0 + 1_234 <= sent < T0 + 1_234 + grain
    key, name = entry_ref(part, "tmr_x", T0 + 1_234, grain)
    assert key == f"{part}/{sent // 1000}"
    assert name == f"tmr_x@{T0 + 1_234 - sent // 1000 * 1000:03d}"
    same_instant = [p for p in range(sent - grain + 1, sent + 1, 997)]
    refs = {entry_ref(part, "tmr_x", p, grain) for p in same_instant}
    assert {k for k, _ in refs} == {key} and len(refs) == len(same_instant)


def test_a_tenants_timers_share_spread_consecutive_partitions() -> None:
    ids = [f"tmr_{i}" for i in range(2_000)]
    parts = {partition_for("acme", i, 8) for i in ids}
    assert len(parts) == 8
    home = partition_for("acme", "", 1)  # crc32("") % 1 == 0: the tenant's first partition
    assert parts == {(home + k) % PARTITIONS for k in range(8)}
    assert partition_for("acme", "tmr_1", 8) == partition_for("acme", "tmr_1", 8)  # stable
    assert {partition_for("acme", i, 1) for i in ids} == {partition_for("acme", "tmr_0", 1)}
    assert all(0 <= partition_for("t", i, PARTITIONS * 2) < PARTITIONS for i in ids)


# ---------------------------------------------------------------- entries


def test_who_may_claim_over_an_entry() -> None:
    now = T0 + 100_000

    def decide(existing: Entry | None, rev: int = 1, fresh: bool = True, at: int = now) -> str:
        return decide_claim(existing, rev=rev, fresh=fresh, owner="me", now_ms=at)

    assert decide(None) == "claim"
    assert decide(fence(2), 2) == decide(fence(2), 3) == "claim"
    assert decide(fence(3), 2) == "stale"  # a change at a newer revision owns it
    # a card of an older revision (or of an inactive timer) never creates a claim (R2)
    assert decide(None, fresh=False) == decide(fence(1), fresh=False) == "stale"
    live = Entry("p", 1, n=1, owner="o", until=now)
    assert decide(live) == decide(live, at=now + LAPSE_MARGIN_MS) == "wait"
    assert decide(live, at=now + LAPSE_MARGIN_MS + 1) == "take_over"  # lapsed after the margin
    assert decide(live, fresh=False, at=now + LAPSE_MARGIN_MS + 1) == "take_over"  # owed
    assert decide(replace(live, until=0)) == "take_over"  # released by its run
    assert decide(replace(live, owner="me")) == "ours"
    for state in ("d", "f", "k"):
        assert decide(Entry(state, 1, n=1), 5) == "done"


def test_an_entrys_state_sorts_it() -> None:
    assert fence(4) == Entry("t", 4)
    states: tuple[State, ...] = ("p", "d", "f", "k", "t")
    assert [Entry(s, 1).finished for s in states] == [False, True, True, True, False]
    assert [Entry(s, 1).is_fire for s in states] == [True, True, True, False, False]
    assert Entry("p", 1, owner="o", until=T0).lapses_at == T0 + LAPSE_MARGIN_MS + 1


def test_step_never_fires_a_position_in_the_future() -> None:
    timer = _timer(schedule=EverySchedule(1))
    with pytest.raises(ValueError, match="never fire early"):
        step(timer, T0 + 1_000, 0, T0 + 999)
    decided = step(timer, T0 + 1_000, 0, T0 + 1_000)
    assert (decided.fire_ms, decided.n, decided.next_pos, decided.jump) == (
        T0 + 1_000, 1, T0 + 2_000, False,
    )  # fmt: skip
    assert step(timer, T0 + 1_000, 41, T0 + 1_000).n == 42  # counts on from the card's n


def test_a_plain_fire_chains_the_plans_next_and_the_last_one_ends_the_chain() -> None:
    timer = _timer(schedule=EverySchedule(1), max_fires=2)
    first = _head(timer)
    entry = _claim(timer, first, first.pos)
    assert (entry.state, entry.rev, entry.n, entry.pv) == ("p", 1, 1, None)
    assert (entry.owner, entry.until) == ("o", first.pos + 30_000)
    assert (entry.fired, entry.next, entry.end) == (None, None, False)
    assert successor(entry, first.pos, timer.plan) == T0 + 2_000  # the plan's next
    second = _next_card(first, entry, timer)
    assert second is not None
    assert (second.pos, second.n, second.pv) == (T0 + 2_000, 1, T0 + 1_000)
    assert second.timer == first.timer and second.member == "acme|tmr_x"
    last = _claim(timer, second, second.pos)
    assert (last.n, last.pv, last.end) == (2, T0 + 1_000, True)  # max_fires reached
    assert successor(last, second.pos, timer.plan) is None
    assert _next_card(second, last, timer) is None


def test_a_one_shot_has_no_successor_and_an_entrys_decision_wins_over_the_plan() -> None:
    plan = _timer(schedule=EverySchedule(1)).plan
    at = _timer(schedule=AtSchedule(T0 + 5_000)).plan
    assert successor(Entry("d", 1, n=1), T0 + 5_000, at) is None
    assert successor(Entry("d", 1, n=1), T0 + 1_000, plan) == T0 + 2_000
    assert successor(Entry("d", 1, n=1, next=T0 + 9_000), T0 + 1_000, plan) == T0 + 9_000
    assert successor(Entry("d", 1, n=1, next=T0 + 9_000, end=True), T0 + 1_000, plan) is None
    # an adoption may hand a one-shot's owed fire a successor: the entry decides
    assert successor(Entry("d", 2, n=1, next=T0 + 9_000), T0 + 5_000, at) == T0 + 9_000


def test_a_card_moves_along_its_chain_and_keeps_its_checkpoint() -> None:
    timer = _timer(schedule=EverySchedule(1))
    card = Card(timer, T0 + 1_000, 0, None, ckpt=T0 + 1_000)
    moved = card.at(T0 + 2_000, 1, T0 + 1_000)
    assert (moved.pos, moved.n, moved.pv, moved.ckpt) == (T0 + 2_000, 1, T0 + 1_000, T0 + 1_000)
    assert moved.at(T0 + 3_000, 2, T0 + 2_000, ckpt=T0 + 3_000).ckpt == T0 + 3_000
    assert (card.pos, card.n) == (T0 + 1_000, 0)  # cards are values


def test_a_catch_up_fire_is_recorded_at_the_position_it_jumped_from() -> None:
    timer = _timer(schedule=EverySchedule(60), misfire="fire_once")
    head = _head(timer)  # 10:01, now 10:10:50: minutes 1..10 missed
    now = T0 + 10 * 60_000 + 50_000
    entry = _claim(timer, head, now)
    assert (entry.fired, entry.next, entry.n) == (T0 + 600_000, T0 + 660_000, 1)
    following = _next_card(head, entry, timer)
    assert following is not None and (following.pos, following.pv) == (T0 + 660_000, head.pos)
    assert needs_checkpoint(entry, chained=True)  # a jump: the prefix restarts there
    skipped = _claim(replace(timer, misfire="skip"), head, now)
    assert (skipped.state, skipped.n, skipped.next) == ("k", 0, T0 + 660_000)
    # merely late (within the grace): the position itself fires, whatever the policy
    late = _claim(replace(timer, misfire="skip"), head, head.pos + MISFIRE_GRACE_MS - 1)
    assert (late.state, late.fired, late.next, late.n) == ("p", None, None, 1)


@pytest.mark.parametrize(
    ("n", "chained", "end", "jump", "expected"),
    [
        (5, True, False, False, False),
        (CHECKPOINT_EVERY, True, False, False, True),  # every so many fires
        (5, False, False, False, True),  # the chain leaves Redis: its checkpoint is the wake
        (5, True, True, False, True),  # done
        (5, True, False, True, True),  # a misfire jump
    ],
)
def test_when_a_checkpoint_is_needed(
    n: int, chained: bool, end: bool, jump: bool, expected: bool
) -> None:
    entry = Entry("d", 1, n=n, end=end, next=T0 if jump else None)
    assert needs_checkpoint(entry, chained) is expected


def test_a_skip_never_counts_as_the_checkpointing_fire() -> None:
    assert not needs_checkpoint(Entry("k", 1, n=CHECKPOINT_EVERY), chained=True)


# ---------------------------------------------------------------- chains in memory


class Claims:
    """Fire-log entries in memory, with the reads a walk makes counted."""

    def __init__(self) -> None:
        self.entries: dict[EntryRef, Entry] = {}
        self.reads = 0

    def read(self, refs: Sequence[EntryRef]) -> dict[EntryRef, Entry | None]:
        self.reads += 1
        return {ref: self.entries.get(ref) for ref in refs}

    def put(self, timer: Timer, pos: int, entry: Entry) -> None:
        self.entries[entry_ref(timer.partition, timer.id, pos)] = entry


@dataclass
class Chain:
    """A timer fired by triggers: the stored timer, every checkpoint it ever had (oldest
    first), its card in Redis (None: done), and when it last ran."""

    stored: Timer
    card: Card | None
    checkpoints: list[Timer] = field(default_factory=list)
    now: int = T0

    def checkpoint(self, timer: Timer) -> None:
        self.stored = timer
        self.checkpoints.append(timer)


def start(timer: Timer) -> Chain:
    return Chain(timer, _head(timer), [timer])


def run_at(claims: Claims, chain: Chain, now: int, adopt: int | None = None) -> None:
    """A trigger at ``now``: every due position fires (or the misfire policy decides), the card
    moves on, and the checkpoint moves where the rules say. With ``adopt``, a change lands
    between the first claim and its record and adopts it (R5): its revision, and a next
    position ``adopt`` positions of the plan later than the claim's own successor."""
    chain.now = now
    while chain.card is not None and chain.card.pos <= now:
        card, stored = chain.card, chain.stored
        entry = _claim(stored, card, now)
        following = successor(entry, card.pos, stored.plan)
        if adopt is not None and entry.state == "p" and following is not None:
            later = positions(stored.plan, following, adopt + 1)[-1]
            entry = replace(entry, rev=stored.rev + 1, next=later, end=False)
            # the change keeps the checkpoint on the owed fire until it is recorded (R3)
            chain.checkpoint(
                replace(
                    stored,
                    rev=stored.rev + 1,
                    next_fire_ms=card.pos,
                    fire_count=card.n,
                    last_fire_pos=card.pv,
                )
            )
            stored, adopt = chain.stored, None
            card = replace(card, timer=stored)  # the chain goes on under the new revision
        done = _finished(entry, now)
        claims.put(stored, card.pos, done)
        following = successor(done, card.pos, stored.plan)
        chained = following is not None and following <= now + LOOKAHEAD_MS
        if needs_checkpoint(done, chained):
            chain.checkpoint(
                replace(
                    stored,
                    next_fire_ms=following,
                    fire_count=done.n,
                    last_fire_pos=card.pos,
                    status="completed" if following is None else stored.status,
                )
            )
        chain.card = None if following is None else card.at(following, done.n, card.pos)


def fire_chain(claims: Claims, timer: Timer, runs: list[int]) -> Timer:
    """Triggers running at each time of ``runs``; returns the stored timer (its last
    checkpoint)."""
    chain = start(timer)
    for now in runs:
        run_at(claims, chain, now)
    return chain.stored


def reference(timer: Timer, runs: list[int]) -> Timer:
    """The first edition: the timer rewritten by ``advance`` at every fire."""
    for now in runs:
        while (
            timer.status == "active"
            and timer.next_fire_ms is not None
            and (timer.next_fire_ms <= now)
        ):
            decision = catch_up(timer.plan, timer.next_fire_ms, now, timer.misfire,
                                MISFIRE_GRACE_MS)  # fmt: skip
            timer = timers.advance(timer, decision.fire_ms, now)
    return timer


def follow(timer: Timer, claims: Claims) -> Cursor:
    """The cursor by definition: from the checkpoint, position by position along the chain
    (each entry's successor: its ``nx``, its end, else the plan's next) to the first position
    not finished; a fire claimed there is owed. Past max_fires nothing new is claimed."""
    pos, n, last = timer.next_fire_ms, timer.fire_count, timer.last_fire_pos
    while pos is not None:
        entry = claims.entries.get(entry_ref(timer.partition, timer.id, pos))
        if entry is None or not entry.finished:
            owed = entry if entry is not None and entry.state == "p" else None
            spent = timer.max_fires is not None and n >= timer.max_fires
            return Cursor(None, n, last) if spent and owed is None else Cursor(pos, n, last, owed)
        n, last, pos = entry.n, pos, successor(entry, pos, timer.plan)
    return Cursor(None, n, last)


schedules = st.one_of(
    st.builds(EverySchedule, st.sampled_from([1, 5, 60, 90, 3_600])),
    st.builds(
        CronSchedule,
        st.sampled_from(["*/5 * * * *", "0 * * * *", "30 2 * * *"]),
        st.sampled_from(["UTC", "Europe/Berlin"]),
    ),
    st.builds(AtSchedule, st.integers(T0, T0 + 3_600_000)),
)


@settings(max_examples=150, deadline=None)
@given(
    schedule=schedules,
    misfire=st.sampled_from(["fire_once", "fire_all", "skip"]),
    max_fires=st.one_of(st.none(), st.integers(1, 400)),
    gaps=st.lists(st.integers(1, 4 * 3_600_000), min_size=1, max_size=12),
)
def test_the_derived_view_is_what_advance_would_show(
    schedule: Schedule, misfire: Misfire, max_fires: int | None, gaps: list[int]
) -> None:
    """Triggers run at random times (an outage is a long gap): walking the entries from the
    last checkpoint shows the same cursor, count and status as advancing the timer on every
    fire did."""
    timer = _timer(schedule=schedule, misfire=misfire, max_fires=max_fires)
    runs = [T0 + sum(gaps[: i + 1]) for i in range(len(gaps))]
    claims = Claims()
    stored = fire_chain(claims, timer, runs)
    (cursor,) = drive([walk(stored)], claims.read)
    shown = resolved(stored, cursor)
    expected = reference(timer, runs)
    assert (shown.next_fire_ms, shown.fire_count, shown.status) == (
        expected.next_fire_ms, expected.fire_count, expected.status,
    )  # fmt: skip
    assert claims.reads <= 2 * 9  # a binary search per window, at most two windows


Ending = Literal["none", "claimed", "lapsed", "fenced", "lowered", "lowered_sent"]
MINUTE = 60_000


def end_chain(claims: Claims, chain: Chain, ending: Ending) -> int | None:
    """What may stand at the cursor when it is walked: nothing, a claim (live, or lapsed: owed
    either way), a change's fence, or a claim adopted by a change that lowered max_fires to the
    fires so far (the checkpoint stays on the owed fire: R3), recorded or not. Returns the
    cursor's position."""
    card, stored = chain.card, chain.stored
    if card is None or ending == "none":
        return None if card is None else card.pos
    if ending == "fenced":  # a change committed: its fence on the cursor
        chain.checkpoint(replace(stored, rev=stored.rev + 1))
        claims.put(stored, card.pos, fence(stored.rev + 1))
        return card.pos
    owed = _claim(stored, card, max(chain.now, card.pos))
    if ending in ("claimed", "lapsed"):
        claims.put(stored, card.pos, replace(owed, until=0) if ending == "lapsed" else owed)
        return card.pos
    adopted = replace(owed, rev=stored.rev + 1, next=None, end=True)
    chain.checkpoint(
        replace(
            stored,
            rev=stored.rev + 1,
            max_fires=card.n,
            next_fire_ms=card.pos,
            fire_count=card.n,
            last_fire_pos=card.pv,
        )
    )
    if ending == "lowered":
        claims.put(stored, card.pos, adopted)
        return card.pos
    claims.put(stored, card.pos, _finished(adopted, card.pos))
    return None


@settings(max_examples=200, deadline=None)
@given(
    schedule=schedules,
    misfire=st.sampled_from(["fire_once", "fire_all", "skip"]),
    max_fires=st.one_of(st.none(), st.integers(1, 300)),
    runs=st.lists(
        st.tuples(st.integers(1, 3 * 3_600_000), st.one_of(st.none(), st.integers(0, 200))),
        min_size=1,
        max_size=10,
    ),
    ending=st.sampled_from(["none", "claimed", "lapsed", "fenced", "lowered", "lowered_sent"]),
    back=st.integers(0, 10_000),
)
# a fire_once outage: the chain jumps (nx) from 10:02 to 10:12 over positions never claimed;
# walked from the first checkpoint, the walk must follow the jump
@example(EverySchedule(60), "fire_once", None, [(MINUTE, None), (11 * MINUTE, None)], "none", 0)
@example(EverySchedule(60), "skip", None, [(MINUTE, None), (11 * MINUTE, None)], "claimed", 0)
# a change adopted the claim at 10:00:01 and moved the chain 40 s on (an nx inside the window)
@example(EverySchedule(1), "fire_all", None, [(1_000, 39), (90_000, None)], "none", 0)
# ... and 300 s on: beyond the window of CHECKPOINT_EVERY positions
@example(EverySchedule(1), "fire_all", None, [(3_000, 300), (30_000, None)], "lapsed", 0)
# more fires than a window since the first checkpoint: the walk goes on window by window
@example(EverySchedule(1), "fire_all", None, [(1_000, None), (400_000, None)], "fenced", 0)
@example(EverySchedule(1), "fire_all", 3, [(10_000, None)], "none", 0)  # done at max_fires
@example(EverySchedule(5), "fire_all", None, [(4_000, None)], "claimed", 0)  # nothing fired yet
@example(EverySchedule(1), "fire_all", None, [(5_000, None)], "lowered", 0)  # owed past max
@example(EverySchedule(1), "fire_all", None, [(5_000, None)], "lowered_sent", 0)
def test_walk_finds_the_cursor(
    schedule: Schedule,
    misfire: Misfire,
    max_fires: int | None,
    runs: list[tuple[int, int | None]],
    ending: Ending,
    back: int,
) -> None:
    """The lemma of docs/fire-path.md: from any checkpoint the timer ever had, the walk - a
    binary search over the plan's positions, following ``nx`` where it meets one - ends at the
    cursor: the first chain position not finished, found by following the chain one position
    at a time. Chains come from triggers at random times, with outages (misfire jumps) and
    changes adopting a claim (an ``nx`` anywhere ahead); at the end the cursor may be claimed,
    fenced, or owed past a lowered max_fires (:func:`end_chain`)."""
    claims = Claims()
    chain = start(_timer(schedule=schedule, misfire=misfire, max_fires=max_fires))
    for gap, adopt in runs:
        run_at(claims, chain, chain.now + gap, adopt)
    cursor_pos = end_chain(claims, chain, ending)

    latest = chain.stored
    expected = follow(latest, claims)
    assert expected.pos == cursor_pos
    claims.reads = 0
    assert drive([walk(latest)], claims.read) == [expected]
    assert claims.reads <= 2 * 9  # a binary search per window, at most two windows
    if ending in ("lowered", "lowered_sent") and chain.card is not None:
        assert claims.reads == 1  # past max_fires only the owed position is read
    older = chain.checkpoints[back % len(chain.checkpoints)]
    assert follow(older, claims) == expected  # the chain from any checkpoint has one cursor
    assert drive([walk(older)], claims.read) == [expected]


def test_the_cursor_is_the_first_position_not_finished() -> None:
    timer = _timer(schedule=EverySchedule(1))
    claims = Claims()
    stored = fire_chain(claims, timer, [T0 + 3_000])  # fired 1, 2, 3 s
    next_ref = entry_ref(7, "tmr_x", T0 + 4_000)
    (cursor,) = drive([walk(stored)], claims.read)
    assert cursor == Cursor(T0 + 4_000, 3, T0 + 3_000, None)
    claims.entries[next_ref] = fence(2)
    (cursor,) = drive([walk(stored)], claims.read)
    assert cursor == Cursor(T0 + 4_000, 3, T0 + 3_000, None)
    for owner, until in (("live", T0 + 60_000), ("dead", T0)):  # a claimed fire is owed
        claimed = Entry("p", 1, n=4, pv=T0 + 3_000, owner=owner, until=until)
        claims.entries[next_ref] = claimed
        (cursor,) = drive([walk(stored)], claims.read)
        assert cursor == Cursor(T0 + 4_000, 3, T0 + 3_000, claimed)
        assert settled(stored, cursor).next_fire_ms == T0 + 5_000  # a change comes after it


def test_a_walk_follows_an_adopted_claim_to_the_changes_next_position() -> None:
    """A change adopted the pending fire at 4 s and moved the timer's next position to 30 s."""
    timer = _timer(schedule=EverySchedule(1))
    claims = Claims()
    stored = fire_chain(claims, timer, [T0 + 3_000])
    stored = replace(stored, rev=2)
    adopted = Entry("d", 2, n=4, pv=T0 + 3_000, enqueued=T0 + 4_000, next=T0 + 30_000)
    claims.entries[entry_ref(7, "tmr_x", T0 + 4_000)] = adopted
    claims.entries[entry_ref(7, "tmr_x", T0 + 5_000)] = fence(2)  # never fired: not a fire
    (cursor,) = drive([walk(stored)], claims.read)
    assert cursor == Cursor(T0 + 30_000, 4, T0 + 4_000, None)


def test_settled_is_where_a_change_starts() -> None:
    """The derived timer as if its owed fire had finished: an owed fire of the current revision
    goes on along the plan (or ends the timer at max_fires); one adopted by a newer revision goes
    where the adoption says; without an owed fire it is what the walk shows."""
    timer = _timer(schedule=EverySchedule(1), max_fires=5)
    claims = Claims()
    stored = fire_chain(claims, timer, [T0 + 3_000])
    (plain,) = drive([walk(stored)], claims.read)
    assert settled(stored, plain) == resolved(stored, plain)
    assert (resolved(stored, plain).next_fire_ms, resolved(stored, plain).fire_count) == (
        T0 + 4_000, 3,
    )  # fmt: skip
    owed = Entry("p", 1, n=4, pv=T0 + 3_000, owner="o", until=T0 + 60_000)
    at_four = Cursor(T0 + 4_000, 3, T0 + 3_000, owed)
    after = settled(stored, at_four)
    assert (after.next_fire_ms, after.fire_count, after.last_fire_pos, after.status) == (
        T0 + 5_000, 4, T0 + 4_000, "active",
    )  # fmt: skip
    last = settled(stored, replace(at_four, pending=replace(owed, n=5, end=True)))
    assert (last.next_fire_ms, last.fire_count, last.status) == (None, 5, "completed")
    # adopted by revision 2, which moved the next fire to 30 s
    moved = replace(stored, rev=2)
    adopted = settled(moved, replace(at_four, pending=replace(owed, rev=2, next=T0 + 30_000)))
    assert (adopted.next_fire_ms, adopted.fire_count) == (T0 + 30_000, 4)
    paused = settled(replace(stored, status="paused"), at_four)  # a paused timer stays paused
    assert (paused.next_fire_ms, paused.status) == (T0 + 5_000, "paused")
    completed = resolved(replace(stored, status="completed"), plain)
    assert (completed.next_fire_ms, completed.status) == (None, "completed")


def test_walks_of_many_timers_share_their_reads() -> None:
    claims = Claims()
    every_second = [T0 + k * 1_000 for k in range(1, 101)]
    stored = [fire_chain(claims, replace(_timer(schedule=EverySchedule(1)), id=f"tmr_{i}"),
                         every_second) for i in range(50)]  # fmt: skip
    cursors = drive([walk(t) for t in stored], claims.read)
    assert {c.n for c in cursors} == {100}
    assert claims.reads <= 8  # one batch read per step of the binary search, for all 50
    assert drive([], claims.read) == []


def test_history_is_newest_first_skips_skips_and_pages() -> None:
    timer = _timer(schedule=EverySchedule(60), misfire="skip")
    claims = Claims()
    # fires at 1, 2, 3 min; down until 60:50 (skip: nothing of it fires); then 61 min
    runs = [T0 + 60_000, T0 + 120_000, T0 + 180_000, T0 + 3_650_000, T0 + 3_700_000]
    stored = fire_chain(claims, timer, runs)
    (cursor,) = drive([walk(stored)], claims.read)
    [(page, more)] = drive([history(timer, cursor.last, 2)], claims.read)
    assert [pos for pos, _ in page] == [T0 + 3_660_000, T0 + 180_000]  # the skip is not a fire
    [(rest, end)] = drive([history(timer, more, 10)], claims.read)
    assert ([pos for pos, _ in rest], end) == ([T0 + 120_000, T0 + 60_000], None)
    [(nothing, none)] = drive([history(timer, None, 10)], claims.read)
    assert (nothing, none) == ([], None)


def test_a_fire_owed_past_max_fires_is_read_and_counted() -> None:
    """A change lowered max_fires to the fires so far while the next was claimed: the checkpoint
    stays on the owed fire, whose count is then above max_fires. The walk reads that one
    position - pending shows it owed, finished counts it - and claims nothing after it."""
    timer = _timer(schedule=EverySchedule(1))
    claims = Claims()
    stored = fire_chain(claims, timer, [T0 + 1_000])  # fired 1 s
    stored = replace(stored, rev=2, max_fires=1, next_fire_ms=T0 + 2_000, fire_count=1,
                     last_fire_pos=T0 + 1_000)  # fmt: skip
    ref = entry_ref(7, "tmr_x", T0 + 2_000)
    claims.reads = 0
    (cursor,) = drive([walk(stored)], claims.read)
    assert cursor == Cursor(None, 1, T0 + 1_000)  # nothing claimed there: done at max_fires
    owed = Entry("p", 2, n=2, pv=T0 + 1_000, owner="run", until=T0 + 60_000, end=True)
    claims.entries[ref] = owed
    (cursor,) = drive([walk(stored)], claims.read)
    assert cursor == Cursor(T0 + 2_000, 1, T0 + 1_000, owed)
    assert settled(stored, cursor).fire_count == 2
    claims.entries[ref] = replace(owed, state="d", owner=None, until=None, enqueued=T0 + 2_000)
    (cursor,) = drive([walk(stored)], claims.read)
    assert cursor == Cursor(None, 2, T0 + 2_000)
    assert claims.reads <= 3  # one position per walk, not a window


def test_positions_follow_the_plan_and_stop_where_it_ends() -> None:
    every = _timer(schedule=EverySchedule(1), end_ms=T0 + 3_000).plan
    assert positions(every, T0 + 1_000, 10) == [T0 + 1_000, T0 + 2_000, T0 + 3_000]
    assert positions(every, T0 + 1_000, 2) == [T0 + 1_000, T0 + 2_000]
    assert positions(every, None, 5) == []
    one_shot = _timer(schedule=AtSchedule(T0 + 5_000)).plan
    assert positions(one_shot, T0 + 5_000, 5) == [T0 + 5_000]
    assert next_fire(every, T0 + 3_000) is None


def test_a_chain_is_held_an_hour_ahead_within_what_the_retention_lets_a_walk_read() -> None:
    """An hourly timer stays chained in Redis (no checkpoint per fire); a walk from a
    checkpoint - CHECKPOINT_EVERY positions at most - must find its entries unexpired."""
    lookahead, day = 120_000, 86_400_000
    assert hold_ms(lookahead, 30 * day) == HOLD_MS >= 60 * 60_000
    for days in (1, 2, 7, 30, 3_650):
        held = hold_ms(lookahead, days * day)
        assert lookahead <= held <= HOLD_MS
        assert held * CHECKPOINT_EVERY <= days * day / 2 or held == lookahead

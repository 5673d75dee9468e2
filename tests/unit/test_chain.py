"""The fire path's pure rules: members, claim entries, the step decision, checkpoints, walks.

The property tests run whole chains of fires in memory (as triggers would: claim entries,
checkpoints where the rules ask for them, misfire decisions after outages) and check that the
view derived by walking the entries is exactly what the first edition's state machine
(``timers.core.timer.advance``, which rewrote the timer on every fire) would show.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.clock import T0
from timers.core import timer as timers
from timers.core.chain import (
    CHECKPOINT_EVERY,
    HOLD_MS,
    LAPSE_MARGIN_MS,
    MISFIRE_GRACE_MS,
    PARTITIONS,
    Cursor,
    Entry,
    EntryRef,
    Member,
    check_name,
    claim_key,
    decide_claim,
    drive,
    entry_for,
    entry_name,
    entry_ref,
    history,
    hold_ms,
    needs_checkpoint,
    next_member,
    partition_for,
    resolved,
    settled,
    step,
    tombstone,
    walk,
)
from timers.core.schedule import AtSchedule, CronSchedule, EverySchedule, Misfire, catch_up
from timers.core.timer import Timer
from timers.firing import ClockSync, lag_bucket
from timers.sending import callback_body

LOOKAHEAD_MS = 120_000


def _timer(**fields: Any) -> Timer:
    fields.setdefault("payload_json", "null")
    created = timers.create("acme", "tmr_x", target_queue_url="q", now_ms=T0, **fields)
    return replace(created, rev=1, partition=7)


def _head(timer: Timer) -> Member:
    assert timer.next_fire_ms is not None
    return Member(timer.tenant, timer.id, timer.next_fire_ms, timer.rev, timer.fire_count,
                  timer.last_fire_pos)  # fmt: skip


# ---------------------------------------------------------------- names and keys


def test_member_round_trips_through_its_string() -> None:
    for member in (Member("acme", "tmr_x", T0, 3, 0), Member("a-b", "tmr_y", T0, 1, 9, T0 - 5)):
        assert Member.parse(str(member)) == member
    assert str(Member("acme", "tmr_x", T0, 3, 2, None)) == f"acme|tmr_x|{T0}|3|2|"


@pytest.mark.parametrize("bad", ["", "a|b", "a@b"])
def test_names_that_would_break_a_member_or_an_entry_are_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        check_name(bad, "tenant")


def test_an_entry_is_keyed_by_partition_second_and_timer_ms() -> None:
    assert claim_key(7, T0 + 1_234) == f"7/{(T0 + 1_234) // 1000}"
    assert entry_name("tmr_x", T0 + 1_234) == "tmr_x@234"
    assert entry_ref(7, "tmr_x", T0 + 5) == (f"7/{T0 // 1000}", "tmr_x@005")


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
    assert decide(tombstone(2), 2) == decide(tombstone(2), 3) == "claim"
    assert decide(tombstone(3), 2) == "stale"  # a change at a newer revision owns it
    # a member of an older revision (or of an inactive timer) never creates a claim (R2)
    assert decide(None, fresh=False) == decide(tombstone(1), fresh=False) == "stale"
    live = Entry("p", 1, n=1, owner="o", until=now)
    assert decide(live) == decide(live, at=now + LAPSE_MARGIN_MS) == "wait"
    assert decide(live, at=now + LAPSE_MARGIN_MS + 1) == "take_over"  # lapsed after the margin
    assert decide(live, fresh=False, at=now + LAPSE_MARGIN_MS + 1) == "take_over"  # owed
    assert decide(replace(live, until=0)) == "take_over"  # released by its run
    assert decide(replace(live, owner="me")) == "ours"
    for state in ("d", "f", "k"):
        assert decide(Entry(state, 1, n=1), 5) == "done"  # type: ignore[arg-type]


def test_step_never_fires_a_position_in_the_future() -> None:
    timer = _timer(schedule=EverySchedule(1))
    with pytest.raises(ValueError, match="never fire early"):
        step(timer, _head(timer), T0 + 999)
    decided = step(timer, _head(timer), T0 + 1_000)
    assert (decided.fire_ms, decided.n, decided.next_pos, decided.jump) == (
        T0 + 1_000, 1, T0 + 2_000, False,
    )  # fmt: skip


def test_a_plain_fire_chains_the_plans_next_and_the_last_one_ends_the_chain() -> None:
    timer = _timer(schedule=EverySchedule(1), max_fires=2)
    first = _head(timer)
    entry = entry_for(step(timer, first, first.due), first, "o", T0 + 30_000)
    assert (entry.state, entry.n, entry.fired, entry.next, entry.end) == ("p", 1, None, None, False)
    second = next_member(first, entry, timer.plan)
    assert second == Member("acme", "tmr_x", T0 + 2_000, 1, 1, T0 + 1_000)
    last = entry_for(step(timer, second, second.due), second, "o", T0 + 30_000)
    assert (last.n, last.end) == (2, True)
    assert next_member(second, last, timer.plan) is None


def test_a_catch_up_fire_is_recorded_at_the_position_it_jumped_from() -> None:
    timer = _timer(schedule=EverySchedule(60), misfire="fire_once")
    head = _head(timer)  # 10:01, now 10:10:50: minutes 1..10 missed
    now = T0 + 10 * 60_000 + 50_000
    entry = entry_for(step(timer, head, now), head, "o", now + 30_000)
    assert (entry.fired, entry.next, entry.n) == (T0 + 600_000, T0 + 660_000, 1)
    following = next_member(head, entry, timer.plan)
    assert following is not None and (following.due, following.pv) == (T0 + 660_000, head.due)
    assert needs_checkpoint(entry, chained=True)  # a jump: the prefix restarts there
    skipped = entry_for(step(replace(timer, misfire="skip"), head, now), head, "o", now)
    assert (skipped.state, skipped.n, skipped.next) == ("k", 0, T0 + 660_000)


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


# ---------------------------------------------------------------- derived views


class Claims:
    """Claim entries in memory, with the reads a walk makes counted."""

    def __init__(self) -> None:
        self.entries: dict[EntryRef, Entry] = {}
        self.reads = 0

    def read(self, refs: Any) -> dict[EntryRef, Entry | None]:
        self.reads += 1
        return {ref: self.entries.get(ref) for ref in refs}


def fire_chain(claims: Claims, timer: Timer, runs: list[int]) -> Timer:
    """Triggers running at each time of ``runs``: every due position fires (or the misfire
    policy decides), the chain goes on, and the checkpoint moves where the rules say. Returns
    the stored timer (its last checkpoint)."""
    stored = timer
    member: Member | None = _head(timer)
    for now in runs:
        while member is not None and member.due <= now:
            decided = step(stored, member, now)
            entry = replace(entry_for(decided, member, "o", now), state="d" if decided.fire_ms
                            is not None else "k", owner=None, until=None)  # fmt: skip
            claims.entries[entry_ref(stored.partition, stored.id, member.due)] = entry
            following = next_member(member, entry, stored.plan)
            chained = following is not None and following.due <= now + LOOKAHEAD_MS
            if needs_checkpoint(entry, chained):
                stored = replace(
                    stored,
                    next_fire_ms=None if following is None else following.due,
                    fire_count=entry.n,
                    last_fire_pos=member.due,
                    status="completed" if following is None else stored.status,
                )
            member = following
    return stored


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
    schedule: Any, misfire: Misfire, max_fires: int | None, gaps: list[int]
) -> None:
    """Triggers run at random times (an outage is a long gap): walking the claim entries from
    the last checkpoint shows the same cursor, count and status as advancing the timer on
    every fire did."""
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


def test_the_cursor_is_the_first_position_not_finished() -> None:
    timer = _timer(schedule=EverySchedule(1))
    claims = Claims()
    stored = fire_chain(claims, timer, [T0 + 3_000])  # fired 1, 2, 3 s
    next_ref = entry_ref(7, "tmr_x", T0 + 4_000)
    (cursor,) = drive([walk(stored)], claims.read)
    assert cursor == Cursor(T0 + 4_000, 3, T0 + 3_000, None)
    claims.entries[next_ref] = tombstone(2)
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
    claims.entries[entry_ref(7, "tmr_x", T0 + 5_000)] = tombstone(2)  # never fired: not a fire
    (cursor,) = drive([walk(stored)], claims.read)
    assert cursor == Cursor(T0 + 30_000, 4, T0 + 4_000, None)


def test_walks_of_many_timers_share_their_reads() -> None:
    claims = Claims()
    every_second = [T0 + k * 1_000 for k in range(1, 101)]
    stored = [fire_chain(claims, replace(_timer(schedule=EverySchedule(1)), id=f"tmr_{i}"),
                         every_second) for i in range(50)]  # fmt: skip
    cursors = drive([walk(t) for t in stored], claims.read)
    assert {c.n for c in cursors} == {100}
    assert claims.reads <= 8  # one batch read per step of the binary search, for all 50


def test_history_is_newest_first_skips_skips_and_pages() -> None:
    timer = _timer(schedule=EverySchedule(60), misfire="skip")
    claims = Claims()
    # fires at 1, 2, 3 min; down until 60:50 (skip: nothing of it fires); then 61 min
    runs = [T0 + 60_000, T0 + 120_000, T0 + 180_000, T0 + 3_650_000, T0 + 3_700_000]
    stored = fire_chain(claims, timer, runs)
    (cursor,) = drive([walk(stored)], claims.read)
    [(page, more)] = drive([history(7, "tmr_x", cursor.last, 2)], claims.read)
    assert [pos for pos, _ in page] == [T0 + 3_660_000, T0 + 180_000]  # the skip is not a fire
    [(rest, end)] = drive([history(7, "tmr_x", more, 10)], claims.read)
    assert ([pos for pos, _ in rest], end) == ([T0 + 120_000, T0 + 60_000], None)


# ---------------------------------------------------------------- the clock and the body


def test_the_clock_is_corrected_by_the_reference_and_bounded_by_its_error() -> None:
    host = [T0 + 300]  # this host runs 300 ms ahead

    def host_clock() -> int:
        host[0] += 2  # each read takes 2 ms
        return host[0]

    sync = ClockSync(host_clock, lambda: host[0] - 300)
    sync.measure()
    assert sync.offset is not None and -302 <= sync.offset <= -298
    assert sync.error == 2 and sync.trusted  # half the 2 ms round trip + 1 ms resolution
    assert sync.lower() <= host[0] - 300  # never ahead of the reference
    far = ClockSync(lambda: T0 + 5_000, lambda: T0)
    far.measure()
    assert not far.trusted
    assert not ClockSync(lambda: T0, lambda: T0).trusted  # never measured


def test_a_step_of_the_host_wall_clock_does_not_move_the_lower_bound() -> None:
    """Between measures, elapsed time comes from the monotonic clock: an NTP step of the wall
    clock (here an hour forward) cannot make a send look due early."""
    reference, wall, mono = [T0], [T0 + 40], [5_000]
    sync = ClockSync(lambda: wall[0], lambda: reference[0], lambda: mono[0])
    sync.measure()
    assert sync.trusted and sync.lower() <= T0
    wall[0] += 3_600_000  # stepped
    mono[0] += 250
    reference[0] += 250
    assert sync.lower() <= reference[0] <= sync.now()
    sync.measure()  # the next measure sees the wall clock is broken: nothing is sent
    assert not sync.trusted


@pytest.mark.parametrize(
    ("lag", "bucket"),
    [(0, "on_time"), (100, "on_time"), (101, "le_200ms"), (200, "le_200ms"), (600, "le_600ms"),
     (601, "le_1s"), (1_000, "le_1s"), (2_000, "le_2s"), (2_001, "gt_2s"), (60_000, "gt_2s")],
)  # fmt: skip
def test_lag_bucket(lag: int, bucket: str) -> None:
    assert lag_bucket(lag) == bucket


def test_callback_body_embeds_the_stored_payload_verbatim() -> None:
    text = '{"b":1,"a":[1.50,"ü"]}'  # key order and number spelling as the client sent them
    timer = _timer(schedule=AtSchedule(T0 + 1_000), payload_json=text, name=None)
    body = callback_body(timer, T0 + 1_000, T0 + 1_041)
    assert body.endswith(f',"payload":{text}}}')
    assert json.loads(body) == {
        "fire_id": f"tmr_x:{T0 + 1_000}",
        "timer_id": "tmr_x",
        "tenant": "acme",
        "name": None,
        "scheduled_at": "2026-11-21T10:00:01.000Z",
        "fired_at": "2026-11-21T10:00:01.041Z",
        "payload": {"b": 1, "a": [1.5, "ü"]},
    }


def test_a_timers_card_round_trips() -> None:
    timer = _timer(schedule=CronSchedule("0 7 * * 1-5", "Europe/Berlin"), name="n", max_fires=3)
    back = timers.from_card("acme", "tmr_x", timers.to_card(timer))
    assert back == replace(timer, status="active", next_fire_ms=None, created_ms=0, updated_ms=0,
                           expires_ms=None)  # fmt: skip


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


def test_a_chain_is_held_an_hour_ahead_within_what_the_retention_lets_a_walk_read() -> None:
    """An hourly timer stays chained in Redis (no checkpoint per fire); a walk from a
    checkpoint - CHECKPOINT_EVERY positions at most - must find its entries unexpired."""
    lookahead, day = 120_000, 86_400_000
    assert hold_ms(lookahead, 30 * day) == HOLD_MS >= 60 * 60_000
    for days in (1, 2, 7, 30, 3_650):
        held = hold_ms(lookahead, days * day)
        assert lookahead <= held <= HOLD_MS
        assert held * CHECKPOINT_EVERY <= days * day / 2 or held == lookahead

"""Write a timer's fire-log entries the way the trigger does, for tests of what reads them.

The trigger's own tests cover how it gets there; these let the api, migrator and view tests
start from "this timer fired n times" without running one.
"""

from __future__ import annotations

from dataclasses import replace

from timers.core.timer import Timer
from timers.engine.changes import card_of
from timers.engine.entries import Entry, State, entry_for, ref_of, step, successor
from timers.engine.index import Card
from timers.engine.log import FireLog


def head(timer: Timer) -> Card:
    """The card a timer's checkpoint stands for (as a create, change or restore puts it)."""
    assert timer.next_fire_ms is not None, "the timer has no position left to fire"
    return card_of(timer)


def fire(
    log: FireLog,
    timer: Timer,
    times: int,
    *,
    lag_ms: int = 0,
    state: State = "d",
    start: Card | None = None,
) -> Card | None:
    """Claim and record ``times`` positions of the timer's chain from ``start`` (default: its
    checkpoint), each sent ``lag_ms`` after it was due (``state`` "f": failed); returns the
    card that comes next (None: the chain ended). The timer's checkpoint is not moved."""
    card: Card | None = start or head(timer)
    for _ in range(times):
        assert card is not None, "the timer has no position left to fire"
        decided = step(timer, card.pos, card.n, card.pos)
        pending = entry_for(decided, timer.rev, card.pos, card.pv, "test", card.pos + 30_000)
        done = replace(
            pending,
            state=state,
            owner=None,
            until=None,
            enqueued=card.pos + lag_ms,
            reason="QueueDoesNotExist: gone" if state == "f" else None,
            hook=timer.webhook is not None,
        )
        _claim(log, timer, card.pos, done)
        following = successor(done, card.pos, timer.plan)
        card = None if following is None else card.at(following, done.n, card.pos)
    return card


def _claim(log: FireLog, timer: Timer, pos: int, done: Entry) -> None:
    """Into the entry's home: the first item on its path that is unsealed (a full one is sealed
    first, as the trigger does)."""
    ref = ref_of(timer, pos)
    for _ in range(3):
        at = log.locate([ref], consistent=True)[ref]
        assert at.entry is None, f"{ref} already has an entry: {at.entry}"
        if log.claim(at.key, {ref[1]: done}):
            return
        log.seal(at.key)  # full: its positions live below it from now on
    raise AssertionError(f"no home found for {ref}")


def entry(log: FireLog, timer: Timer, pos: int) -> Entry | None:
    ref = ref_of(timer, pos)
    return log.read([ref], consistent=True)[ref]

"""Write a timer's claim entries the way the trigger does, for tests of what reads them.

The trigger's own tests cover how it gets there; these let the api, migrator and view tests
start from "this timer fired n times" without running one.
"""

from __future__ import annotations

from dataclasses import replace

from timers.adapters.claims import ClaimStore
from timers.core.chain import Entry, Member, entry_for, entry_ref, next_member, step
from timers.core.timer import Timer


def head(timer: Timer) -> Member:
    """The member a timer's checkpoint stands for."""
    assert timer.next_fire_ms is not None
    return Member(
        timer.tenant, timer.id, timer.next_fire_ms, timer.rev, timer.fire_count,
        timer.last_fire_pos,
    )  # fmt: skip


def fire(
    claims: ClaimStore,
    timer: Timer,
    times: int,
    *,
    lag_ms: int = 0,
    state: str = "d",
    start: Member | None = None,
) -> Member | None:
    """Claim and record ``times`` positions of the timer's chain from ``start`` (default: its
    checkpoint), each sent ``lag_ms`` after it was due; returns the member that comes next."""
    member: Member | None = start or head(timer)
    for _ in range(times):
        assert member is not None, "the timer has no position left to fire"
        decided = step(timer, member, member.due)
        pending = entry_for(decided, member, "test", member.due + 30_000)
        done = replace(
            pending,
            state=state,  # type: ignore[arg-type]
            owner=None,
            until=None,
            enqueued=member.due + lag_ms,
            reason="QueueDoesNotExist: gone" if state == "f" else None,
        )
        key, name = entry_ref(timer.partition, timer.id, member.due)
        assert claims.claim(key, {name: done})
        member = next_member(member, done, timer.plan)
    return member


def entry(claims: ClaimStore, timer: Timer, pos: int) -> Entry | None:
    ref = entry_ref(timer.partition, timer.id, pos)
    return claims.read([ref], consistent=True)[ref]

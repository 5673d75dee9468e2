"""The fan-out against a real redis-server, with a fake clock and a recorder for Lambda invokes.

It guards the dispatch half of invariant 2 (never lost): every member has a hint or a run that
will see it, a lost hint or invocation comes back through the sweep, overlapping or dead
fan-out runs hand the polling over; and that no bucket is invoked twice while its run is queued
or going. Runs are interleaved by stepping ``Fanout.steps`` on one fake clock.
"""

from __future__ import annotations

import itertools
import json
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
import redis

from tests.support.clock import T0, FakeClock
from timers.adapters.redis_index import HINTS_KEY, Lock, RedisIndex
from timers.adapters.warmth import WarmthStore
from timers.core.chain import Member
from timers.fanout import (
    COLD_AFTER_MS,
    COLD_HEADROOM,
    DEFAULT_COLD_START_MS,
    LEAD_MS,
    LOCK_KEY,
    LOCK_RENEW_MS,
    LOCK_TTL_MS,
    MAX_COLD_START_MS,
    MAX_PARALLEL,
    MAX_RUN_MS,
    PER_TRIGGER,
    POLL_MS,
    RAN_WRITE_MS,
    STOP_MARGIN_MS,
    SWEEP_MS,
    Fanout,
    FanoutDeps,
    cold_lead_ms,
    cold_start_sample,
    is_cold,
    next_cold_estimate,
    run_deadline,
    run_fanout,
    runs_wanted,
)

pytestmark = pytest.mark.integration

BUCKETS = 8
TRIGGER = "timers-trigger"
FAR = T0 + 3_600_000  # a lease deadline no test reaches


@dataclass
class Invokes:
    """Stands in for boto3's Lambda ``invoke``: records each async invoke (payload and the fake
    time it happened), fails the next ``fail`` ones, and runs ``then`` after a recorded one."""

    clock: FakeClock
    calls: list[dict[str, Any]] = field(default_factory=list)
    fail: int = 0
    then: Callable[[dict[str, Any]], None] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, **kwargs: Any) -> dict[str, int]:
        assert kwargs["FunctionName"] == TRIGGER
        assert kwargs["InvocationType"] == "Event"
        payload = json.loads(kwargs["Payload"])
        with self._lock:
            if self.fail:
                self.fail -= 1
                raise RuntimeError("TooManyRequestsException")
            self.calls.append({**payload, "clock": self.clock()})
        if self.then is not None:
            self.then(payload)
        return {"StatusCode": 202}

    def buckets(self) -> list[int]:
        return [c["bucket"] for c in self.calls]


def make_deps(client: Any, clock: FakeClock, invokes: Invokes, **overrides: Any) -> FanoutDeps:
    tokens = itertools.count(1)

    def sleep(seconds: float) -> None:  # never waits: the fake clock moves instead
        clock.advance(round(seconds * 1000))

    deps = FanoutDeps(
        index=RedisIndex(client, BUCKETS),
        lock=Lock(client, LOCK_KEY, LOCK_TTL_MS),
        invoke=invokes,
        trigger_function=TRIGGER,
        clock=clock,
        sleep=sleep,
        new_token=lambda: f"fan-{next(tokens)}",
    )
    return replace(deps, **overrides)


@pytest.fixture
def invokes(clock: FakeClock) -> Invokes:
    return Invokes(clock)


@pytest.fixture
def index(redis_client: redis.Redis) -> RedisIndex:
    return RedisIndex(redis_client, BUCKETS)


@pytest.fixture
def deps(redis_client: redis.Redis, clock: FakeClock, invokes: Invokes) -> FanoutDeps:
    return make_deps(redis_client, clock, invokes)


def add(index: RedisIndex, bucket: int, n: int, due: int, tenant: str = "acme") -> list[Member]:
    """``n`` one-shot members due at ``due`` in ``bucket``, added as the migrator does."""
    members = [Member(tenant, f"tmr_{bucket}_{due}_{i}", due, 1, 0) for i in range(n)]
    assert index.ensure([(bucket, m, None) for m in members]) == n
    return members


def act_at(fanout: Fanout, clock: FakeClock, *instants: int) -> None:
    for at in instants:
        clock.now = at
        fanout.act()


def run_ended(index: RedisIndex, call: dict[str, Any]) -> None:
    """What ``timers.firing.run_trigger`` does when a run ends: clear its marker, re-hint."""
    assert index.end_run(call["bucket"], call["slot"], call["token"])
    index.rehint(call["bucket"])


@dataclass
class FakeTrigger:
    """A trigger run that happens at once when invoked: it leases what is due by the time the
    real one would wait for (the invocation plus LEAD_MS), finishes it, ends its run."""

    index: RedisIndex
    taken: list[tuple[Member, int]] = field(default_factory=list)  # (member, invocation ms)

    def __call__(self, payload: dict[str, Any]) -> None:
        bucket, at = payload["bucket"], payload["at_ms"]
        owner = f"{payload['token']}/{payload['slot']}"
        got = self.index.lease(
            bucket, now_ms=at, until_ms=at + LEAD_MS, deadline_ms=FAR, limit=10_000, owner=owner
        )
        self.index.finish(bucket, owner, at, [(m, None) for m in got.members])
        self.taken += [(m, at) for m in got.members]
        run_ended(self.index, payload)


# ---------------------------------------------------------------- pure decisions


@pytest.mark.parametrize(
    ("backlog", "expected"),
    [
        (0, 1),  # a bucket hinted is worth one run, even if its count raced to zero
        (1, 1),
        (PER_TRIGGER, 1),
        (PER_TRIGGER + 1, 2),
        (3 * PER_TRIGGER, 3),
        (MAX_PARALLEL * PER_TRIGGER, MAX_PARALLEL),
        (MAX_PARALLEL * PER_TRIGGER + 1, MAX_PARALLEL),
        (10**9, MAX_PARALLEL),
    ],
)
def test_runs_wanted_is_ceil_backlog_over_per_trigger_capped(backlog: int, expected: int) -> None:
    assert runs_wanted(backlog) == expected


@pytest.mark.parametrize(
    ("remaining", "expected"),
    [
        (900_000, MAX_RUN_MS),  # a long timeout: a minute plus overlap, no more
        (MAX_RUN_MS + STOP_MARGIN_MS, MAX_RUN_MS),
        (30_000, 30_000 - STOP_MARGIN_MS),  # a short one leaves the margin free
        (STOP_MARGIN_MS, 0),
        (1_000, 0),
    ],
)
def test_run_deadline(remaining: int, expected: int) -> None:
    assert run_deadline(T0, remaining) == T0 + expected


# ---------------------------------------------------------------- one poll at a time


def test_nothing_hinted_invokes_nothing(
    deps: FanoutDeps, clock: FakeClock, invokes: Invokes, index: RedisIndex
) -> None:
    add(index, 2, 1, T0 + 2 * POLL_MS + LEAD_MS + 1)  # not yet within the lead
    fanout = Fanout(deps)
    act_at(fanout, clock, T0, T0 + POLL_MS, T0 + 2 * POLL_MS)
    assert invokes.calls == []
    r = fanout.report
    assert (r.polls, r.sweeps, r.skipped, r.busy, r.errors, r.invocations) == (3, 1, 0, 0, 0, 0)


def test_a_member_is_dispatched_once_it_is_due_within_the_lead_and_not_before(
    deps: FanoutDeps,
    clock: FakeClock,
    invokes: Invokes,
    index: RedisIndex,
    redis_client: redis.Redis,
) -> None:
    due = T0 + 1_000
    add(index, 3, 1, due)
    fanout = Fanout(deps)
    act_at(fanout, clock, T0, T0 + 500, due - LEAD_MS - 1)
    assert invokes.calls == []

    act_at(fanout, clock, due - LEAD_MS)
    assert invokes.calls == [
        {
            "bucket": 3,
            "slot": 0,
            "token": fanout.token,
            "at_ms": due - LEAD_MS,
            "clock": due - LEAD_MS,
        }
    ]
    assert redis_client.get(index.run_key(3, 0)) == fanout.token.encode()  # queued
    assert index.hints_until(FAR) == []  # the run will re-hint when it ends

    act_at(fanout, clock, due - LEAD_MS + POLL_MS, due, due + SWEEP_MS)  # the sweep included
    assert len(invokes.calls) == 1
    assert (fanout.report.invocations, fanout.report.failed_invocations) == (1, 0)


def test_an_overdue_member_is_dispatched_at_the_first_poll(
    deps: FanoutDeps, clock: FakeClock, invokes: Invokes, index: RedisIndex
) -> None:
    add(index, 5, 2, T0 - 3 * 60_000)  # three minutes late (Redis rebuilt after an outage)
    fanout = Fanout(deps)
    act_at(fanout, clock, T0)
    assert [(c["bucket"], c["slot"], c["at_ms"]) for c in invokes.calls] == [(5, 0, T0)]


def test_a_bucket_is_not_invoked_again_while_its_run_is_queued_or_going(
    deps: FanoutDeps, clock: FakeClock, invokes: Invokes, index: RedisIndex
) -> None:
    add(index, 1, 1, T0 + 100)
    fanout = Fanout(deps)
    act_at(fanout, clock, T0)
    (first,) = invokes.calls

    add(index, 1, 1, T0 + 150)  # more work for the bucket while its run is queued
    act_at(fanout, clock, T0 + 25, T0 + 50)
    index.touch_run(1, 0, first["token"], 60_000)  # the run started and marks itself going
    later = [T0 + 75 + POLL_MS * i for i in range(50)]  # includes a sweep at T0 + 1_000
    act_at(fanout, clock, *later)
    assert invokes.calls == [first]
    assert fanout.report.busy == 2  # wanted a run (after the add, after the sweep): slot taken
    assert fanout.report.sweeps == 2

    run_ended(index, first)  # what run_trigger does last (here it fired nothing)
    act_at(fanout, clock, later[-1] + POLL_MS)
    assert len(invokes.calls) == 2
    assert (invokes.calls[1]["bucket"], invokes.calls[1]["slot"]) == (1, 0)


def test_a_big_backlog_gets_parallel_runs_capped_and_only_while_it_needs_them(
    deps: FanoutDeps,
    clock: FakeClock,
    invokes: Invokes,
    index: RedisIndex,
    redis_client: redis.Redis,
) -> None:
    add(index, 2, 3 * PER_TRIGGER - 1, T0)  # three runs' worth
    add(index, 6, MAX_PARALLEL * PER_TRIGGER + 1, T0)  # more than the cap
    fanout = Fanout(deps)
    act_at(fanout, clock, T0)
    slots = Counter((c["bucket"], c["slot"]) for c in invokes.calls)
    assert slots == Counter({(2, s): 1 for s in range(3)} | {(6, s): 1 for s in range(8)})
    assert fanout.report.invocations == 3 + MAX_PARALLEL

    # The runs of bucket 2 take all but 40 members and end; bucket 6's keep going (and the
    # sweep has hinted their bucket again).
    index.lease(2, now_ms=T0, until_ms=T0, deadline_ms=FAR, limit=2 * PER_TRIGGER + 209, owner="r")
    for call in [c for c in invokes.calls if c["bucket"] == 2]:
        run_ended(index, call)
    index.rehint(6)
    invokes.calls.clear()
    act_at(fanout, clock, T0 + POLL_MS, T0 + 2 * POLL_MS)
    assert [(c["bucket"], c["slot"]) for c in invokes.calls] == [(2, 0)]  # one run is enough
    assert fanout.report.busy == MAX_PARALLEL  # bucket 6 wanted its eight: all still going
    assert [redis_client.exists(index.run_key(2, s)) for s in range(3)] == [1, 0, 0]


def test_smallest_backlog_first(
    deps: FanoutDeps,
    clock: FakeClock,
    invokes: Invokes,
    index: RedisIndex,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("timers.fanout.INVOKE_WORKERS", 1)  # one lane: the order is visible
    add(index, 1, 5, T0)
    add(index, 4, 1, T0 + 90)
    add(index, 6, 3, T0 + 50)
    add(index, 7, 3, T0)  # as small as bucket 6's, and due earlier
    add(index, 0, PER_TRIGGER + 1, T0 + 10)
    fanout = Fanout(deps)
    act_at(fanout, clock, T0)
    assert [(c["bucket"], c["slot"]) for c in invokes.calls] == [
        (4, 0), (7, 0), (6, 0), (1, 0), (0, 0), (0, 1),
    ]  # fmt: skip


def test_a_failed_invoke_frees_the_slot_and_the_sweep_rehints_the_bucket(
    deps: FanoutDeps,
    clock: FakeClock,
    invokes: Invokes,
    index: RedisIndex,
    redis_client: redis.Redis,
) -> None:
    add(index, 3, 1, T0 + 100)
    invokes.fail = 1  # throttled
    fanout = Fanout(deps)
    act_at(fanout, clock, T0)
    assert (fanout.report.invocations, fanout.report.failed_invocations) == (0, 1)
    assert redis_client.exists(index.run_key(3, 0)) == 0  # the slot is free again
    assert invokes.calls == []

    act_at(fanout, clock, *range(T0 + POLL_MS, T0 + SWEEP_MS, POLL_MS))
    assert invokes.calls == []  # no hint until the sweep
    act_at(fanout, clock, T0 + SWEEP_MS)
    assert [(c["bucket"], c["slot"], c["at_ms"]) for c in invokes.calls] == [(3, 0, T0 + SWEEP_MS)]
    assert fanout.report.sweeps == 2


def test_a_lost_hint_is_restored_by_the_sweep_within_SWEEP_MS(
    deps: FanoutDeps,
    clock: FakeClock,
    invokes: Invokes,
    index: RedisIndex,
    redis_client: redis.Redis,
) -> None:
    fanout = Fanout(deps)
    act_at(fanout, clock, T0)  # swept at T0
    add(index, 4, 1, T0 + 300)
    # Redis lost the hints (a failover lost the last writes) right after a sweep: the worst case
    redis_client.delete(HINTS_KEY)
    steps = iter(range(T0 + POLL_MS, T0 + 2 * SWEEP_MS, POLL_MS))
    for at in steps:
        act_at(fanout, clock, at)
        if invokes.calls:
            break
    assert [c["at_ms"] for c in invokes.calls] == [T0 + SWEEP_MS]  # the next sweep's poll
    assert fanout.report.sweeps == 2
    act_at(fanout, clock, *steps)
    assert len(invokes.calls) == 1


def test_a_stale_low_hint_without_backlog_is_replaced_by_the_true_earliest(
    deps: FanoutDeps, clock: FakeClock, invokes: Invokes, index: RedisIndex
) -> None:
    add(index, 2, 1, T0 + 5_000)
    index.hint(2, T0 - 1_000)  # a member that was deferred or taken meanwhile left it low
    fanout = Fanout(deps)
    act_at(fanout, clock, T0)
    assert invokes.calls == []
    assert index.hints_until(FAR) == [(2, T0 + 5_000)]
    act_at(fanout, clock, T0 + 5_000 - LEAD_MS)
    assert [(c["bucket"], c["at_ms"]) for c in invokes.calls] == [(2, T0 + 5_000 - LEAD_MS)]


@pytest.mark.parametrize("ends", ["before the poll starts runs", "while the poll starts runs"])
def test_a_run_ending_during_a_poll_leaves_its_bucket_hinted_or_running(
    deps: FanoutDeps,
    clock: FakeClock,
    invokes: Invokes,
    index: RedisIndex,
    redis_client: redis.Redis,
    ends: str,
) -> None:
    """A bucket's run is going; the poll sees more work for it. Wherever the run's end (marker
    cleared, then re-hinted) falls within the poll, the work keeps a hint or a run: it is
    dispatched by the next poll, not a sweep later."""
    (m,) = add(index, 1, 1, T0 + 100)
    assert index.start_run(1, 0, "going", 60_000)
    ended: list[int] = []

    def end_the_going_run() -> None:
        if not ended:
            ended.append(clock())
            assert index.end_run(1, 0, "going")
            index.rehint(1)

    class Ending:
        bucket_count = BUCKETS

        def __getattr__(self, name: str) -> Any:
            return getattr(index, name)

        def backlog(self, buckets: Sequence[int], until_ms: int, now_ms: int) -> dict[int, int]:
            got = index.backlog(buckets, until_ms, now_ms)
            if ends == "before the poll starts runs":
                end_the_going_run()
            return got

        def start_run(self, bucket: int, slot: int, token: str, ttl_ms: int) -> bool:
            started = index.start_run(bucket, slot, token, ttl_ms)
            if ends == "while the poll starts runs":
                end_the_going_run()
            return started

    fanout = Fanout(replace(deps, index=Ending()))
    act_at(fanout, clock, T0)
    assert ended == [T0]
    marked = redis_client.exists(index.run_key(1, 0)) == 1
    assert marked or index.hints_until(FAR) == [(1, m.due)]  # never neither
    act_at(fanout, clock, T0 + POLL_MS)
    assert [c["bucket"] for c in invokes.calls] == [1]
    assert invokes.calls[0]["at_ms"] <= T0 + POLL_MS


def test_a_member_added_during_a_poll_keeps_its_hint(
    deps: FanoutDeps, clock: FakeClock, invokes: Invokes, index: RedisIndex
) -> None:
    """The poll read the hint; a member added before it takes the hint lowers it, so the
    compare-and-delete leaves it for the next poll instead of losing it."""
    add(index, 5, 1, T0 + 150)
    added: list[Member] = []

    class Racing:
        bucket_count = BUCKETS

        def __getattr__(self, name: str) -> Any:
            return getattr(index, name)

        def take_hint(self, bucket: int, hint_ms: int) -> bool:
            if not added:
                added.extend(add(index, bucket, 1, T0 + 20))
            return index.take_hint(bucket, hint_ms)

    fanout = Fanout(replace(deps, index=Racing()))
    act_at(fanout, clock, T0)
    assert [(c["bucket"], c["slot"]) for c in invokes.calls] == [(5, 0)]
    assert index.hints_until(FAR) == [(5, T0 + 20)]  # survived
    run_ended(index, invokes.calls[0])
    act_at(fanout, clock, T0 + POLL_MS)
    assert [(c["bucket"], c["slot"]) for c in invokes.calls] == [(5, 0), (5, 0)]


def test_a_redis_error_costs_one_poll_only(
    deps: FanoutDeps, clock: FakeClock, invokes: Invokes, index: RedisIndex
) -> None:
    add(index, 6, 1, T0)
    failures = {"hints_until": 1, "sweep": 1}

    class Flaky:
        bucket_count = BUCKETS

        def __getattr__(self, name: str) -> Any:
            real = getattr(index, name)
            if failures.get(name):

                def fail(*args: Any, **kwargs: Any) -> Any:
                    failures[name] -= 1
                    raise redis.ConnectionError("failover")

                return fail
            return real

    fanout = Fanout(replace(deps, index=Flaky()))
    steps = fanout.steps(T0, T0 + 10 * POLL_MS)
    for at in steps:  # the run acts at ``at`` when stepped next
        clock.now = at
        if invokes.calls:
            break
    # at T0 the sweep failed, at T0 + POLL_MS the poll's read: each cost that poll only
    assert [(c["bucket"], c["at_ms"]) for c in invokes.calls] == [(6, T0 + 2 * POLL_MS)]
    assert (fanout.report.errors, fanout.report.polls, fanout.report.sweeps) == (2, 2, 1)
    for at in steps:
        clock.now = at
    assert fanout.report.errors == 2
    assert fanout.report.polls == 10
    assert len(invokes.calls) == 1


# ---------------------------------------------------------------- runs over time


@dataclass
class SimRun:
    """A fan-out run in the simulation: its steps, the instant it waits for, its polls."""

    fanout: Fanout
    steps: Iterator[int]
    wake: int
    dies_after: int | None = None  # stops after acting at this instant, without releasing
    polled: list[int] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)


def start(deps: FanoutDeps, start_ms: int, deadline_ms: int, **kw: Any) -> SimRun:
    fanout = Fanout(deps)
    steps = fanout.steps(start_ms, deadline_ms)
    return SimRun(fanout, steps, next(steps), **kw)


def simulate(clock: FakeClock, client: redis.Redis, runs: Sequence[SimRun]) -> None:
    """Step every run in wake order on one fake clock (ties: list order), like concurrent
    Lambdas. Redis expires keys on its own (real) clock, so a dead holder's lock is deleted
    here once the fake clock passes its TTL from its last renew."""
    active = list(runs)
    lock_dies_at: int | None = None
    while active:
        run = min(active, key=lambda r: r.wake)  # min is stable: ties go to the earlier run
        clock.now = max(clock.now, run.wake)
        if lock_dies_at is not None and clock.now > lock_dies_at:
            assert 0 < client.pttl(LOCK_KEY) <= LOCK_TTL_MS  # it would expire on its own
            client.delete(LOCK_KEY)
            lock_dies_at = None
        at, polls = run.wake, run.fanout.report.polls
        try:
            run.wake = next(run.steps)  # acts at ``at``, then names its next instant
            finished = False
        except StopIteration:
            finished = True
        (run.polled if run.fanout.report.polls > polls else run.skipped).append(at)
        if finished:
            run.fanout.release()
            active.remove(run)
        elif run.dies_after is not None and at >= run.dies_after:
            active.remove(run)  # killed: no release, the lock lives until its TTL
            assert (at - T0) % LOCK_RENEW_MS == 0  # it had just renewed the lock
            lock_dies_at = at + LOCK_TTL_MS


def grid(start_ms: int, end_ms: int) -> list[int]:
    return list(range(start_ms, end_ms + 1, POLL_MS))


def test_overlapping_runs_poll_one_at_a_time_and_hand_over_on_release(
    redis_client: redis.Redis, clock: FakeClock, invokes: Invokes, index: RedisIndex
) -> None:
    trigger = FakeTrigger(index)
    invokes.then = trigger
    members = [m for i in range(40) for m in add(index, i % BUCKETS, 1, T0 + 300 + 97 * i)]
    deps = make_deps(redis_client, clock, invokes)
    first = start(deps, T0, T0 + 2_000)
    second = start(deps, T0 + 1_007, T0 + 5_007)  # the next minute's run, started early
    simulate(clock, redis_client, [first, second])

    assert first.polled == grid(T0, T0 + 2_000) and first.skipped == []
    assert second.skipped == grid(T0 + 1_007, T0 + 1_982)  # waited while the first held
    assert second.polled == grid(T0 + 2_007, T0 + 5_007)  # took over at its next step
    assert not set(first.polled) & set(second.polled)
    assert redis_client.exists(LOCK_KEY) == 0

    # every member went to exactly one run, within a poll (two at the handover) of its lead
    taken = dict(trigger.taken)
    assert len(trigger.taken) == len(taken) == len(members)
    for m in members:
        assert m.due - LEAD_MS <= taken[m] < m.due - LEAD_MS + 2 * POLL_MS
    assert Counter(c["token"] for c in invokes.calls) == {
        first.fanout.token: sum(1 for at in taken.values() if at <= T0 + 2_000),
        second.fanout.token: sum(1 for at in taken.values() if at > T0 + 2_000),
    }


def test_a_dead_holders_lock_passes_on_after_its_ttl(
    redis_client: redis.Redis, clock: FakeClock, invokes: Invokes, index: RedisIndex
) -> None:
    trigger = FakeTrigger(index)
    invokes.then = trigger
    dies = T0 + 1_000
    members = [m for i in range(30) for m in add(index, i % BUCKETS, 1, T0 + 250 + 150 * i)]
    deps = make_deps(redis_client, clock, invokes)
    first = start(deps, T0, T0 + 60_000, dies_after=dies)
    second = start(deps, T0 + 510, T0 + 5_010)
    simulate(clock, redis_client, [first, second])

    assert first.polled == grid(T0, dies)
    assert second.skipped == grid(T0 + 510, dies + LOCK_TTL_MS - 10)  # the lock still lived
    assert second.polled == grid(dies + LOCK_TTL_MS + 10, T0 + 5_010)
    assert redis_client.exists(LOCK_KEY) == 0  # the survivor released it

    taken = dict(trigger.taken)
    assert len(trigger.taken) == len(taken) == len(members)  # nothing lost, nothing twice
    takeover = second.polled[0]
    for m in members:
        on_time = m.due - LEAD_MS
        if dies < on_time <= takeover:  # due while nobody polled: at the takeover
            assert taken[m] == takeover
        else:
            assert on_time <= taken[m] < on_time + POLL_MS


def test_run_fanout_ends_at_its_deadline_and_releases_the_lock(
    deps: FanoutDeps,
    clock: FakeClock,
    invokes: Invokes,
    index: RedisIndex,
    redis_client: redis.Redis,
) -> None:
    trigger = FakeTrigger(index)
    invokes.then = trigger
    (m,) = add(index, 7, 1, T0 + 610)
    report = run_fanout(deps, T0, T0 + 2_000)

    assert clock() == T0 + 2_000  # slept (on the fake clock) to each poll, not beyond
    assert (report.polls, report.sweeps, report.skipped, report.errors) == (81, 3, 0, 0)
    assert trigger.taken == [(m, T0 + 425)]  # the first poll with T0 + 610 within the lead
    assert report.invocations == 1
    assert redis_client.exists(LOCK_KEY) == 0  # released for the next run
    assert Lock(redis_client, LOCK_KEY, LOCK_TTL_MS).acquire("next")


def test_run_fanout_releases_the_lock_when_a_step_raises(
    deps: FanoutDeps, clock: FakeClock, redis_client: redis.Redis
) -> None:
    def broken_sleep(seconds: float) -> None:
        raise KeyboardInterrupt  # the runtime stopping the process mid-wait

    with pytest.raises(KeyboardInterrupt):
        run_fanout(replace(deps, sleep=broken_sleep), T0, T0 + 2_000)
    assert redis_client.exists(LOCK_KEY) == 0


# ---------------------------------------------------------------- cluster mode


@pytest.mark.parametrize("client_class", [redis.RedisCluster, redis.Redis])
def test_a_run_works_on_a_cluster_mode_server(
    redis_cluster_url: str,
    client_class: type[redis.Redis] | type[redis.RedisCluster],
    clock: FakeClock,
    invokes: Invokes,
) -> None:
    """ElastiCache Serverless speaks cluster mode: lock, hints, markers and scripts must route."""
    client: Any = client_class.from_url(redis_cluster_url)
    try:
        client.flushall()
        client.script_flush()
        index = RedisIndex(client, BUCKETS)
        trigger = FakeTrigger(index)
        invokes.then = trigger
        added = add(index, 3, 2, T0 + 300) + add(index, 5, 1, T0 + 700)
        report = run_fanout(make_deps(client, clock, invokes), T0, T0 + 1_000)
        assert (report.errors, report.invocations, report.polls) == (0, 2, 41)
        assert sorted(invokes.buckets()) == [3, 5]
        assert sorted(m for m, _ in trigger.taken) == sorted(added)
        assert client.get(LOCK_KEY) is None
    finally:
        client.close()


# ---------------------------------------------------------------- cold buckets start earlier


COLD_MS = 700  # a measured cold start (invoke -> handler)
COLD_LEAD = COLD_HEADROOM * COLD_MS  # a cold bucket's run starts this much earlier than warm


@pytest.fixture
def warmth(redis_url: str, redis_client: redis.Redis) -> Iterator[WarmthStore]:
    client = redis.Redis.from_url(redis_url, decode_responses=True)  # as the functions' is
    yield WarmthStore(client)
    client.close()


@pytest.fixture
def cold_deps(deps: FanoutDeps, warmth: WarmthStore) -> FanoutDeps:
    return replace(deps, warmth=warmth)


@pytest.fixture
def measured_deps(cold_deps: FanoutDeps, warmth: WarmthStore) -> FanoutDeps:
    """The fan-out's deps once a cold trigger has measured its cold start (COLD_MS)."""
    warmth.record_cold_start(COLD_MS)
    return cold_deps


def test_a_cold_bucket_is_invoked_earlier_by_the_measured_cold_start(
    measured_deps: FanoutDeps,
    clock: FakeClock,
    invokes: Invokes,
    index: RedisIndex,
    warmth: WarmthStore,
) -> None:
    due = T0 + 5_000
    add(index, 3, 1, due)  # bucket 3 never ran: its sandboxes are likely cold
    fanout = Fanout(measured_deps)
    act_at(fanout, clock, T0, due - LEAD_MS - COLD_LEAD - 1)
    assert invokes.calls == []

    act_at(fanout, clock, due - LEAD_MS - COLD_LEAD)
    assert [(c["bucket"], c["at_ms"]) for c in invokes.calls] == [(3, due - LEAD_MS - COLD_LEAD)]
    assert (fanout.report.invocations, fanout.report.cold_invocations) == (1, 1)
    assert warmth.last_runs() == {3: due - LEAD_MS - COLD_LEAD}  # a later fan-out knows it ran


def test_a_bucket_that_ran_recently_keeps_the_warm_lead(
    measured_deps: FanoutDeps,
    clock: FakeClock,
    invokes: Invokes,
    index: RedisIndex,
    warmth: WarmthStore,
) -> None:
    due = T0 + 5_000
    warmth.ran([3], due - LEAD_MS - COLD_AFTER_MS)  # still warm when its lead comes
    add(index, 3, 1, due)
    fanout = Fanout(measured_deps)
    act_at(fanout, clock, T0, due - LEAD_MS - COLD_LEAD, due - LEAD_MS - 1)
    assert invokes.calls == []
    act_at(fanout, clock, due - LEAD_MS)
    assert [(c["bucket"], c["at_ms"]) for c in invokes.calls] == [(3, due - LEAD_MS)]
    assert fanout.report.cold_invocations == 0


def test_a_bucket_idle_past_COLD_AFTER_MS_counts_cold_again(
    measured_deps: FanoutDeps,
    clock: FakeClock,
    invokes: Invokes,
    index: RedisIndex,
    warmth: WarmthStore,
) -> None:
    due = T0 + 5_000
    warmth.ran([3], due - LEAD_MS - COLD_LEAD - COLD_AFTER_MS - 1)
    add(index, 3, 1, due)
    fanout = Fanout(measured_deps)
    act_at(fanout, clock, T0, due - LEAD_MS - COLD_LEAD)
    assert [c["at_ms"] for c in invokes.calls] == [due - LEAD_MS - COLD_LEAD]


def test_until_a_cold_start_is_measured_the_default_estimate_leads(
    cold_deps: FanoutDeps, clock: FakeClock, invokes: Invokes, index: RedisIndex
) -> None:
    due = T0 + 10_000
    add(index, 3, 1, due)
    fanout = Fanout(cold_deps)
    lead = LEAD_MS + COLD_HEADROOM * DEFAULT_COLD_START_MS
    act_at(fanout, clock, T0, due - lead - 1)
    assert invokes.calls == []
    act_at(fanout, clock, due - lead)
    assert [c["at_ms"] for c in invokes.calls] == [due - lead]


def test_only_the_cold_buckets_backlog_counts_the_longer_lead(
    measured_deps: FanoutDeps,
    clock: FakeClock,
    invokes: Invokes,
    index: RedisIndex,
    warmth: WarmthStore,
) -> None:
    """A warm bucket whose hint is due within LEAD_MS is counted to LEAD_MS only: members due
    later (within a cold lead) must not ask for parallel runs it does not need yet."""
    warmth.ran([2], T0 - 1_000)
    add(index, 2, 1, T0 + LEAD_MS)
    add(index, 2, PER_TRIGGER, T0 + LEAD_MS + COLD_LEAD)  # beyond the warm lead
    fanout = Fanout(measured_deps)
    act_at(fanout, clock, T0)
    assert [(c["bucket"], c["slot"]) for c in invokes.calls] == [(2, 0)]


def test_an_early_cold_run_that_finds_nothing_yet_is_started_again_warm_in_time(
    measured_deps: FanoutDeps,
    clock: FakeClock,
    invokes: Invokes,
    index: RedisIndex,
) -> None:
    """The estimate was high: the run came up before its members were leasable, ended and
    re-hinted. The bucket now counts warm, so the next start is LEAD_MS ahead, not later."""
    trigger = FakeTrigger(index)
    invokes.then = trigger  # a run that happens at its invocation: as early as can be
    due = T0 + 5_000
    (m,) = add(index, 4, 1, due)
    fanout = Fanout(measured_deps)
    act_at(fanout, clock, *range(T0, due, POLL_MS))
    assert [c["at_ms"] for c in invokes.calls] == [due - LEAD_MS - COLD_LEAD, due - LEAD_MS]
    assert trigger.taken == [(m, due - LEAD_MS)]
    assert (fanout.report.invocations, fanout.report.cold_invocations) == (2, 1)


def test_a_fanout_run_that_takes_the_lock_over_knows_which_buckets_ran(
    measured_deps: FanoutDeps,
    clock: FakeClock,
    invokes: Invokes,
    index: RedisIndex,
) -> None:
    invokes.then = FakeTrigger(index)
    first = Fanout(measured_deps)
    add(index, 5, 1, T0 + 100)
    act_at(first, clock, T0)
    first.release()

    due = T0 + 10_000
    add(index, 5, 1, due)
    second = Fanout(measured_deps)  # the next minute's run, in another sandbox
    act_at(second, clock, T0 + 1_000, due - LEAD_MS - COLD_LEAD, due - LEAD_MS)
    assert [c["at_ms"] for c in invokes.calls] == [T0, due - LEAD_MS]


def test_without_warmth_every_bucket_gets_the_warm_lead(
    deps: FanoutDeps, clock: FakeClock, invokes: Invokes, index: RedisIndex
) -> None:
    assert deps.warmth is None
    due = T0 + 5_000
    add(index, 3, 1, due)
    fanout = Fanout(deps)
    act_at(fanout, clock, T0, due - LEAD_MS - 1, due - LEAD_MS)
    assert [c["at_ms"] for c in invokes.calls] == [due - LEAD_MS]


@pytest.mark.parametrize(
    ("estimate", "expected"),
    [
        (None, COLD_HEADROOM * DEFAULT_COLD_START_MS),
        (0, 0),
        (-5, 0),
        (640, COLD_HEADROOM * 640),
        (MAX_COLD_START_MS, MAX_COLD_START_MS),
        (10**6, MAX_COLD_START_MS),
    ],
)
def test_cold_lead_ms(estimate: int | None, expected: int) -> None:
    assert cold_lead_ms(estimate) == expected


@pytest.mark.parametrize(
    ("last", "now", "cold"),
    [(None, T0, True), (T0, T0, False), (T0 - COLD_AFTER_MS, T0, False),
     (T0 - COLD_AFTER_MS - 1, T0, True)],
)  # fmt: skip
def test_is_cold(last: int | None, now: int, cold: bool) -> None:
    assert is_cold(last, now) is cold


@pytest.mark.parametrize(
    ("at", "initialized", "started", "sample"),
    [
        (None, T0, T0 + 900, None),  # a hand-made invoke: no dispatch instant
        (T0, T0 + 700, T0 + 900, 900),  # invoked before the sandbox had initialized: cold
        (T0, T0, T0 + 900, 900),
        (T0 + 800, T0 + 700, T0 + 900, None),  # a sandbox started ahead (warm-up): not cold
        (T0 + 5, T0 + 700, T0, 0),  # hosts' clocks apart: never negative
    ],
)
def test_cold_start_sample(
    at: int | None, initialized: int, started: int, sample: int | None
) -> None:
    assert cold_start_sample(at, initialized, started) == sample


def test_the_estimate_is_a_decaying_peak_and_redis_folds_it_as_the_core_does(
    warmth: WarmthStore,
) -> None:
    samples = [900, 400, 400, 2_500, 600, 10_000, -3, 700]
    expected: list[int] = []
    previous: int | None = None
    for s in samples:
        previous = next_cold_estimate(previous, s)
        expected.append(previous)
    assert expected[:4] == [900, 775, 681, 2_500]  # down a quarter of the gap; up at once
    assert max(expected) == MAX_COLD_START_MS and min(expected) >= 0
    assert [warmth.record_cold_start(s) for s in samples] == expected
    assert warmth.cold_start_ms() == expected[-1]


def test_a_buckets_run_is_written_to_redis_at_most_every_RAN_WRITE_MS(
    cold_deps: FanoutDeps,
    clock: FakeClock,
    invokes: Invokes,
    index: RedisIndex,
    warmth: WarmthStore,
) -> None:
    invokes.then = FakeTrigger(index)
    fanout = Fanout(cold_deps)
    for at in (T0, T0 + RAN_WRITE_MS - POLL_MS, T0 + RAN_WRITE_MS):
        add(index, 5, 1, at)
        act_at(fanout, clock, at)
        assert [c["at_ms"] for c in invokes.calls][-1] == at
        assert warmth.last_runs() == {5: T0 if at < T0 + RAN_WRITE_MS else at}

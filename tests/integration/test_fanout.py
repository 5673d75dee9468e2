"""The fan-out (``timers.engine.fanout``) against a real redis-server, with a fake clock and a
recorder for Lambda invokes.

It guards the dispatch half of "never lost" (docs/fire-path.md): every bucket is peeked each
POLL_MS and a run is started within its lead of the bucket's head; overlapping fan-out runs
never start a bucket twice while its run is queued or going (run markers); a failed invoke or a
Redis error costs one poll; a lost bucket (no sentinel, restoring too long, unreachable and
back) is handed to the migrator at once, and once; and one bucket's failure never stops the
others. Runs are interleaved by stepping ``Fanout.steps`` / ``Fanout.act`` on one fake clock.
"""

from __future__ import annotations

import itertools
import json
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from typing import Any

import pytest
import redis

from functions.trigger import app as trigger_app
from tests.support.clock import T0, FakeClock
from tests.support.sick_redis import SickRedis
from timers.core.schedule import AtSchedule
from timers.core.timer import Timer
from timers.engine import keys
from timers.engine.fanout import (
    COLD_AFTER_MS,
    COLD_HEADROOM,
    DEFAULT_COLD_START_MS,
    LEAD_MS,
    MAX_COLD_START_MS,
    MAX_PARALLEL,
    MAX_RUN_MS,
    PER_TRIGGER,
    POLL_MS,
    RAN_WRITE_MS,
    RESTORE_MS,
    START_TTL_MS,
    STOP_MARGIN_MS,
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
from timers.engine.index import RUN_BEAT_MS, BucketIndex, Card, PeekPending
from timers.engine.trigger import ARM_MS

pytestmark = pytest.mark.integration

BUCKETS = 8
TRIGGER = "timers-trigger"
MIGRATOR = "timers-migrator"
QUEUE = "https://sqs.us-east-1.amazonaws.com/123456789012/timers-tenant-acme"
FAR = T0 + 3_600_000  # a lease end no test reaches


@dataclass
class Invokes:
    """Stands in for boto3's Lambda ``invoke``: records each async invoke of the trigger (payload
    and the fake time it happened) and each restore asked of the migrator, fails the next
    ``fail`` trigger invokes (``fail_restores`` restores), and runs ``then`` after a recorded
    trigger invoke."""

    clock: FakeClock
    calls: list[dict[str, Any]] = field(default_factory=list)
    restores: list[list[int]] = field(default_factory=list)
    fail: int = 0
    fail_restores: int = 0
    then: Callable[[dict[str, Any]], None] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, **kwargs: Any) -> dict[str, int]:
        assert kwargs["InvocationType"] == "Event"
        payload = json.loads(kwargs["Payload"])
        if kwargs["FunctionName"] == MIGRATOR:
            assert set(payload) == {"restore"}
            with self._lock:
                if self.fail_restores:
                    self.fail_restores -= 1
                    raise RuntimeError("TooManyRequestsException")
                self.restores.append(payload["restore"])
            return {"StatusCode": 202}
        assert kwargs["FunctionName"] == TRIGGER
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

    def restored(self) -> list[int]:
        return sorted(b for r in self.restores for b in r)


def make_deps(index: Any, clock: FakeClock, invokes: Invokes, **overrides: Any) -> FanoutDeps:
    tokens = itertools.count(1)
    deps = FanoutDeps(
        index=index,
        invoke=invokes,
        trigger_function=TRIGGER,
        migrator_function=MIGRATOR,
        clock=clock,
        sleep=clock.sleep,  # never waits: the fake clock moves instead
        new_token=lambda: f"fan-{next(tokens)}",
    )
    return replace(deps, **overrides)


@pytest.fixture
def conn(redis_url: str) -> Iterator[redis.Redis]:
    """A client as the functions have (decoded answers), on an emptied server."""
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    client.flushall()
    yield client
    client.close()


def whole(index: BucketIndex) -> None:
    """Every bucket holds what DynamoDB says (the migrator set its sentinel) and ran a second
    ago (warm)."""
    for bucket in range(index.bucket_count):
        index.set_field(bucket, keys.SENTINEL, "ok")
        index.set_field(bucket, keys.RAN, T0 - 1_000)


@pytest.fixture
def index(conn: redis.Redis) -> BucketIndex:
    index = BucketIndex(conn, BUCKETS)
    whole(index)
    return index


@pytest.fixture
def invokes(clock: FakeClock) -> Invokes:
    return Invokes(clock)


@pytest.fixture
def deps(index: BucketIndex, clock: FakeClock, invokes: Invokes) -> FanoutDeps:
    return make_deps(index, clock, invokes)


def card(bucket: int, due: int, name: str, tenant: str = "acme") -> Card:
    timer = Timer(
        tenant=tenant,
        id=name,
        schedule=AtSchedule(due),
        anchor_ms=T0 - 60_000,
        target_queue_url=QUEUE,
        payload_json="{}",
        next_fire_ms=due,
        rev=1,
        partition=bucket,
    )
    return Card(timer, due, 0, None, due)


def add(index: BucketIndex, bucket: int, n: int, due: int, tenant: str = "acme") -> list[Card]:
    """``n`` one-shot cards due at ``due`` in ``bucket``, put as the api's fast path does."""
    cards = [card(bucket, due, f"tmr_{bucket}_{due}_{i}", tenant) for i in range(n)]
    assert index.put(cards) == n
    return cards


def act_at(fanout: Fanout, clock: FakeClock, *instants: int) -> None:
    for at in instants:
        clock.now = at
        fanout.act()


def run_ended(index: BucketIndex, call: dict[str, Any]) -> None:
    """What ``run_trigger`` does when a run ends: clear its marker."""
    assert index.end_run(call["bucket"], call["slot"], call["token"])


def cold(conn: redis.Redis, *buckets: int) -> None:
    """The buckets never ran (or not for long): their sandboxes are likely cold."""
    for bucket in buckets:
        conn.hdel(keys.data(bucket), keys.RAN)


def stepper(fanout: Fanout, clock: FakeClock, start_ms: int) -> Callable[[], None]:
    """Polls as ``run_fanout`` does (a poll that raises costs that poll only): each call acts
    at the clock's instant and moves the clock to the next poll's."""
    steps = fanout.steps(start_ms, FAR)
    clock.now = next(steps)

    def poll() -> None:
        clock.now = next(steps)

    return poll


def marker(conn: redis.Redis, bucket: int, slot: int = 0) -> str | None:
    got = conn.get(keys.run(bucket, slot))
    return None if got is None else str(got)


@dataclass
class FakeTrigger:
    """A trigger run that happens at once when invoked: it marks itself going, leases what
    falls due within ARM_MS of its invocation, records it fired (drops the cards) and ends."""

    index: BucketIndex
    taken: list[tuple[Card, int]] = field(default_factory=list)  # (card, invocation ms)

    def __call__(self, payload: dict[str, Any]) -> None:
        bucket, slot, token, at = (payload[k] for k in ("bucket", "slot", "token", "at_ms"))
        assert self.index.touch_run(bucket, slot, token, 60_000)
        got = self.index.lease(bucket, at + ARM_MS, FAR, 10_000)
        self.index.settle(bucket, [(c, None, c.timer.rev) for c in got.cards])
        self.taken += [(c, at) for c in got.cards]
        assert self.index.end_run(bucket, slot, token)


# ---------------------------------------------------------------- pure decisions


@pytest.mark.parametrize(
    ("backlog", "expected"),
    [
        (0, 1),  # a bucket due is worth one run, even if its count raced to zero
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


# ---------------------------------------------------------------- one poll at a time


def test_nothing_due_within_the_lead_invokes_nothing(
    deps: FanoutDeps, clock: FakeClock, invokes: Invokes, index: BucketIndex
) -> None:
    add(index, 2, 1, T0 + 2 * POLL_MS + LEAD_MS + 1)  # not yet within the lead
    fanout = Fanout(deps)
    act_at(fanout, clock, T0, T0 + POLL_MS, T0 + 2 * POLL_MS)
    assert (invokes.calls, invokes.restores) == ([], [])
    r = fanout.report
    assert (r.polls, r.busy, r.errors, r.invocations, r.restores) == (3, 0, 0, 0, 0)


def test_a_card_is_dispatched_once_it_is_due_within_the_lead_and_not_before(
    deps: FanoutDeps,
    clock: FakeClock,
    invokes: Invokes,
    index: BucketIndex,
    conn: redis.Redis,
) -> None:
    due = T0 + 1_000
    add(index, 3, 1, due)
    fanout = Fanout(deps)
    act_at(fanout, clock, T0, T0 + 500, due - LEAD_MS - 1)
    assert invokes.calls == []

    act_at(fanout, clock, due - LEAD_MS)
    (call,) = invokes.calls
    assert call == {
        "bucket": 3,
        "slot": 0,
        "token": call["token"],  # the run's own: the fan-out's and a number
        "at_ms": due - LEAD_MS,
        "clock": due - LEAD_MS,
    }
    assert call["token"].startswith(f"{fanout.token}-")
    assert marker(conn, 3) == call["token"]  # queued (a run promises its beats once it starts)
    assert 0 < conn.pttl(keys.run(3, 0)) <= START_TTL_MS  # until the run extends it

    act_at(fanout, clock, due - LEAD_MS + POLL_MS, due, due + 1_000)
    assert len(invokes.calls) == 1
    assert (fanout.report.invocations, fanout.report.failed_invocations) == (1, 0)


def test_a_run_whose_beat_lapsed_is_passed_over_for_one_more_slot(
    deps: FanoutDeps, clock: FakeClock, invokes: Invokes, index: BucketIndex
) -> None:
    """A run that dies (or hangs in a slow call) keeps its marker until the TTL, but its
    promised beat lapses: work coming due in its bucket starts the next slot instead of waiting
    for the marker to expire."""
    add(index, 1, 1, T0 + 100)
    fanout = Fanout(deps)
    act_at(fanout, clock, T0)
    (first,) = invokes.calls
    assert index.touch_run(1, 0, first["token"], 60_000, T0 + 200 + RUN_BEAT_MS)
    assert len(index.lease(1, T0 + 100, T0 + 33_000, 10).cards) == 1  # ... leases, then dies
    add(index, 1, 1, T0 + 5_000)  # the dead run never leases it
    act_at(fanout, clock, *range(T0 + POLL_MS, T0 + 5_000, POLL_MS))
    assert [(c["bucket"], c["slot"]) for c in invokes.calls] == [(1, 0), (1, 1)]
    assert T0 + 5_000 - LEAD_MS <= invokes.calls[1]["at_ms"] < T0 + 5_000  # ahead of its due
    assert fanout.report.lapsed >= 1


def test_a_run_still_queued_is_never_passed_over(
    deps: FanoutDeps, clock: FakeClock, invokes: Invokes, index: BucketIndex
) -> None:
    """An invoked run that has not started (Lambda's queue, a throttle) promised no beat: the
    fan-out waits for it (or for its marker's START_TTL_MS) instead of piling up more runs."""
    add(index, 1, 1, T0 + 100)
    fanout = Fanout(deps)
    act_at(fanout, clock, *range(T0, T0 + 3_000, POLL_MS))
    assert [(c["bucket"], c["slot"]) for c in invokes.calls] == [(1, 0)]
    assert fanout.report.lapsed == 0 and fanout.report.busy > 0


def test_an_overdue_card_is_dispatched_at_the_first_poll(
    deps: FanoutDeps, clock: FakeClock, invokes: Invokes, index: BucketIndex
) -> None:
    add(index, 5, 2, T0 - 3 * 60_000)  # three minutes late (restored after an outage)
    fanout = Fanout(deps)
    act_at(fanout, clock, T0)
    assert [(c["bucket"], c["slot"], c["at_ms"]) for c in invokes.calls] == [(5, 0, T0)]


def test_a_bucket_is_not_invoked_again_while_its_run_is_queued_or_going(
    deps: FanoutDeps, clock: FakeClock, invokes: Invokes, index: BucketIndex
) -> None:
    add(index, 1, 1, T0 + 100)
    fanout = Fanout(deps)
    act_at(fanout, clock, T0)
    (first,) = invokes.calls

    add(index, 1, 1, T0 + 150)  # more work for the bucket while its run is queued
    act_at(fanout, clock, T0 + POLL_MS)
    later = [T0 + 2 * POLL_MS + POLL_MS * i for i in range(50)]
    for at in later:  # the run started: it beats on its marker while it leases
        assert index.touch_run(1, 0, first["token"], 60_000, at + RUN_BEAT_MS)
        act_at(fanout, clock, at)
    assert invokes.calls == [first]
    assert fanout.report.busy == 1 + len(later)  # wanted at every poll: the slot was taken

    run_ended(index, first)  # what run_trigger does last (here it fired nothing)
    act_at(fanout, clock, later[-1] + POLL_MS)
    assert len(invokes.calls) == 2
    assert (invokes.calls[1]["bucket"], invokes.calls[1]["slot"]) == (1, 0)


def test_a_big_backlog_gets_parallel_runs_capped_and_only_while_it_needs_them(
    deps: FanoutDeps,
    clock: FakeClock,
    invokes: Invokes,
    index: BucketIndex,
    conn: redis.Redis,
) -> None:
    add(index, 2, 3 * PER_TRIGGER - 1, T0)  # three runs' worth
    add(index, 6, MAX_PARALLEL * PER_TRIGGER + 1, T0)  # more than the cap
    fanout = Fanout(deps)
    act_at(fanout, clock, T0)
    slots = Counter((c["bucket"], c["slot"]) for c in invokes.calls)
    assert slots == Counter({(2, s): 1 for s in range(3)} | {(6, s): 1 for s in range(8)})
    assert fanout.report.invocations == 3 + MAX_PARALLEL

    # The runs of bucket 2 lease all but 40 cards and end; bucket 6's keep going.
    leased = index.lease(2, T0, FAR, 2 * PER_TRIGGER + 209)
    assert len(leased.cards) == 2 * PER_TRIGGER + 209
    for call in [c for c in invokes.calls if c["bucket"] == 2]:
        run_ended(index, call)
    invokes.calls.clear()
    act_at(fanout, clock, T0 + POLL_MS)
    assert [(c["bucket"], c["slot"]) for c in invokes.calls] == [(2, 0)]  # one run is enough
    assert fanout.report.busy == MAX_PARALLEL  # bucket 6 wanted its eight: all still going
    assert [conn.exists(keys.run(2, s)) for s in range(3)] == [1, 0, 0]


def test_smallest_backlog_first(
    deps: FanoutDeps,
    clock: FakeClock,
    invokes: Invokes,
    index: BucketIndex,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("timers.engine.fanout.INVOKE_WORKERS", 1)  # one lane: order is visible
    add(index, 1, 5, T0)
    add(index, 4, 1, T0 + 90)
    add(index, 6, 3, T0 + 50)
    add(index, 7, 3, T0)  # as small as bucket 6's: either may go first
    add(index, 0, PER_TRIGGER + 1, T0 + 10)
    fanout = Fanout(deps)
    act_at(fanout, clock, T0)
    got = [(c["bucket"], c["slot"]) for c in invokes.calls]
    assert got[0] == (4, 0)
    assert set(got[1:3]) == {(6, 0), (7, 0)}
    assert got[3:] == [(1, 0), (0, 0), (0, 1)]


def test_a_failed_invoke_frees_the_slot_and_the_next_poll_tries_again(
    deps: FanoutDeps,
    clock: FakeClock,
    invokes: Invokes,
    index: BucketIndex,
    conn: redis.Redis,
) -> None:
    add(index, 3, 1, T0 + 100)
    invokes.fail = 1  # throttled
    fanout = Fanout(deps)
    act_at(fanout, clock, T0)
    assert (fanout.report.invocations, fanout.report.failed_invocations) == (0, 1)
    assert conn.exists(keys.run(3, 0)) == 0  # the slot is free again
    assert invokes.calls == []

    act_at(fanout, clock, T0 + POLL_MS)
    assert [(c["bucket"], c["slot"], c["at_ms"]) for c in invokes.calls] == [(3, 0, T0 + POLL_MS)]
    assert (fanout.report.invocations, fanout.report.failed_invocations) == (1, 1)


def test_a_dead_runs_cards_are_dispatched_when_their_lease_ends(
    deps: FanoutDeps, clock: FakeClock, invokes: Invokes, index: BucketIndex
) -> None:
    """A run leased the bucket's cards and died (its marker expired): the bucket's head is the
    lease's end, and the fan-out starts a run within LEAD_MS of it, not before."""
    add(index, 4, 2, T0)
    lease_end = T0 + 35_000
    assert len(index.lease(4, T0, lease_end, 10).cards) == 2
    fanout = Fanout(deps)
    act_at(fanout, clock, *range(T0, lease_end - LEAD_MS, POLL_MS * 10))
    act_at(fanout, clock, lease_end - LEAD_MS - 1)
    assert invokes.calls == []
    act_at(fanout, clock, lease_end - LEAD_MS)
    assert [(c["bucket"], c["at_ms"]) for c in invokes.calls] == [(4, lease_end - LEAD_MS)]


def test_a_redis_error_costs_one_poll_only(
    deps: FanoutDeps, clock: FakeClock, invokes: Invokes, index: BucketIndex
) -> None:
    add(index, 6, 1, T0)
    failures = {"peek": 1, "start_run": 1}

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
    # at T0 the peek failed, at T0 + POLL_MS the run marker's write: each cost that poll only
    assert [(c["bucket"], c["at_ms"]) for c in invokes.calls] == [(6, T0 + 2 * POLL_MS)]
    assert (fanout.report.errors, fanout.report.polls) == (2, 3)
    for at in steps:
        clock.now = at
    assert fanout.report.errors == 2
    assert fanout.report.polls == 11
    assert len(invokes.calls) == 1


# ---------------------------------------------------------------- lost buckets


def test_a_flushed_bucket_is_handed_to_the_migrator_once(
    deps: FanoutDeps,
    clock: FakeClock,
    invokes: Invokes,
    index: BucketIndex,
    conn: redis.Redis,
) -> None:
    """Redis failed over to an empty replica: every bucket lost its sentinel. Two overlapping
    fan-out runs peek at the same instant - the second's whole poll falls between the first's
    peek and its marks - and each bucket is marked restoring and handed to the migrator by one
    of them, once, and not again while its restore runs."""
    second = Fanout(deps)
    raced: list[int] = []

    class Overlapping:
        """The first fan-out's index: the second polls right after the first's peek."""

        bucket_count = BUCKETS

        def __getattr__(self, name: str) -> Any:
            return getattr(index, name)

        def peek(self, buckets: Any, until: int, wait_s: float | None = None) -> Any:
            got = index.peek(buckets, until, wait_s)
            if clock() == T0 + 250 and not raced:
                raced.append(clock())
                second.act()
            return got

    first = Fanout(replace(deps, index=Overlapping()))
    act_at(first, clock, T0)
    act_at(second, clock, T0)
    assert (invokes.restores, first.report.restores, second.report.restores) == ([], 0, 0)

    clock.now = T0 + 250
    conn.flushall()
    add(index, 5, 1, T0 + 300)  # the api's fast path writes into the empty bucket meanwhile
    first.act()
    assert raced == [T0 + 250]
    assert invokes.restores == [list(range(BUCKETS))]  # in one invoke, by the one that marked
    assert (first.report.restores, second.report.restores) == (0, BUCKETS)
    for bucket in range(BUCKETS):
        assert index.field(bucket, keys.SENTINEL) == f"r{T0 + 250}.{T0 + 250}"
    assert invokes.buckets() == [5]  # a restoring bucket is still dispatched, once

    # while the restore runs (the migrator has not set "ok" yet), nobody hands it over again
    for at in range(T0 + 300, T0 + 250 + RESTORE_MS + 1, 1_000):
        act_at(first, clock, at)
        act_at(second, clock, at + 7)
    assert invokes.restored() == list(range(BUCKETS))


@pytest.mark.parametrize(
    "failure",
    [
        "its shard fails",
        "the whole server is unreachable",
        "its first write on its return fails",
    ],
)
def test_a_bucket_that_did_not_answer_is_handed_over_when_it_answers(
    clock: FakeClock, invokes: Invokes, index: BucketIndex, conn: redis.Redis, failure: str
) -> None:
    """A bucket that did not answer a peek may have failed over and lost writes (its sentinel
    still says "ok"): when it answers again it is marked restoring and handed to the migrator,
    whatever else fails on the way."""
    sick = SickRedis(conn)
    fanout = Fanout(make_deps(BucketIndex(sick, BUCKETS), clock, invokes))
    poll = stepper(fanout, clock, T0)
    poll()
    if failure == "the whole server is unreachable":
        sick.unreachable = True
    else:
        sick.sick[3] = "down"
    poll()
    poll()
    assert invokes.restores == []
    assert fanout.report.errors >= 2
    sick.unreachable = False
    sick.sick.clear()
    if failure == "its first write on its return fails":
        sick.sick[3] = "refuses writes"
        poll()
        assert sick.refused[-1][0] == 3  # the mark's write was refused
        sick.sick.clear()
    for _ in range(5):
        poll()
    lost = list(range(BUCKETS)) if failure == "the whole server is unreachable" else [3]
    assert invokes.restored() == lost
    for bucket in range(BUCKETS):
        sentinel = index.field(bucket, keys.SENTINEL)
        assert sentinel is not None
        assert sentinel.startswith("r") if bucket in lost else sentinel == "ok"


def test_a_bucket_whose_shard_is_slow_to_answer_is_no_news_not_an_outage(
    clock: FakeClock, invokes: Invokes, index: BucketIndex
) -> None:
    """A cluster-mode peek answers PeekPending for the buckets of a shard that did not answer
    in SHARD_WAIT_S (busy, or failing over): the other buckets are dispatched in that poll, and
    the slow one, when it answers, is dispatched too and not handed to the migrator."""
    slow = {3}

    class SlowShard:
        bucket_count = BUCKETS

        def __getattr__(self, name: str) -> Any:
            return getattr(index, name)

        def peek(self, buckets: Any, until: int, wait_s: float | None = None) -> Any:
            got = index.peek(buckets, until, wait_s)
            return {b: PeekPending("node-b") if b in slow else p for b, p in got.items()}

    add(index, 1, 1, T0)
    add(index, 3, 1, T0)
    fanout = Fanout(make_deps(SlowShard(), clock, invokes))
    act_at(fanout, clock, T0)
    assert invokes.buckets() == [1]
    assert fanout.report.pending == 1
    slow.clear()
    act_at(fanout, clock, T0 + POLL_MS, T0 + 2 * POLL_MS)
    assert sorted(invokes.buckets()) == [1, 3]
    assert invokes.restores == [] and fanout.report.errors == 0


def test_a_bucket_back_from_an_outage_is_handed_over_once_by_overlapping_fanouts(
    clock: FakeClock, invokes: Invokes, conn: redis.Redis, index: BucketIndex
) -> None:
    sick = SickRedis(conn)
    fanouts = [Fanout(make_deps(BucketIndex(sick, BUCKETS), clock, invokes)) for _ in range(2)]
    for at, down in ((T0, False), (T0 + POLL_MS, True), (T0 + 2 * POLL_MS, False)):
        sick.sick = {3: "down"} if down else {}
        for i, fanout in enumerate(fanouts):
            act_at(fanout, clock, at + 7 * i)
    assert invokes.restores == [[3]]
    assert index.field(3, keys.SENTINEL) == f"r{T0 + 2 * POLL_MS}.{T0 + 2 * POLL_MS}"


def test_a_bucket_restoring_longer_than_RESTORE_MS_is_handed_over_again(
    deps: FanoutDeps, clock: FakeClock, invokes: Invokes, index: BucketIndex
) -> None:
    """The migrator's restore died (or its invoke failed): the bucket stays marked restoring,
    and once the mark is older than RESTORE_MS it is handed over again, by one fan-out - in
    the same epoch, so what the restore has read so far stands."""
    index.set_field(2, keys.SENTINEL, f"r{T0}.{T0}")
    index.set_field(6, keys.SENTINEL, f"r{T0 + 5_000}.{T0 + 5_000}")
    first, second = Fanout(deps), Fanout(deps)
    for at in range(T0, T0 + RESTORE_MS + 1, 500):
        act_at(first, clock, at)
        act_at(second, clock, at)
    assert invokes.restores == []

    act_at(first, clock, T0 + RESTORE_MS + 1)
    act_at(second, clock, T0 + RESTORE_MS + 1)
    assert invokes.restores == [[2]]
    assert index.field(2, keys.SENTINEL) == f"r{T0}.{T0 + RESTORE_MS + 1}"
    for at in range(T0 + RESTORE_MS + 100, T0 + RESTORE_MS + 5_000, 100):
        act_at(first, clock, at)
        act_at(second, clock, at + 7)
    assert invokes.restores == [[2]]
    act_at(second, clock, T0 + 5_000 + RESTORE_MS + 1)
    assert invokes.restores == [[2], [6]]


def test_a_restore_whose_invoke_failed_is_asked_again_after_RESTORE_MS(
    deps: FanoutDeps, clock: FakeClock, invokes: Invokes, index: BucketIndex, conn: redis.Redis
) -> None:
    conn.hdel(keys.data(4), keys.SENTINEL)  # the shard of bucket 4 lost its data
    invokes.fail_restores = 1
    fanout = Fanout(deps)
    act_at(fanout, clock, T0)
    assert (invokes.restores, fanout.report.restores) == ([], 1)
    assert index.field(4, keys.SENTINEL) == f"r{T0}.{T0}"  # marked: the migrator restores it
    act_at(fanout, clock, T0 + RESTORE_MS, T0 + RESTORE_MS + POLL_MS)
    assert invokes.restores == [[4]]


@pytest.mark.parametrize(
    "failure",
    [
        "down",
        "refuses writes while due",
        "refuses writes while lost",
    ],
)
def test_one_bucket_failing_never_stops_the_others_from_being_dispatched(
    clock: FakeClock, invokes: Invokes, index: BucketIndex, conn: redis.Redis, failure: str
) -> None:
    """Bucket 3's shard fails - it does not answer, or it answers reads and refuses writes (out
    of memory, a replica not yet promoted) - while every bucket has a card due: each other bucket
    is dispatched at this very poll, and the sick one once it is well."""
    sick = SickRedis(conn)
    for bucket in range(BUCKETS):  # bucket 1 goes first (smallest backlog), then the sick one
        add(index, bucket, {1: 1, 3: 2}.get(bucket, 3), T0 + 100)
    if failure == "refuses writes while lost":
        conn.hdel(keys.data(3), keys.SENTINEL)
    sick.sick[3] = "down" if failure == "down" else "refuses writes"
    fanout = Fanout(make_deps(BucketIndex(sick, BUCKETS), clock, invokes))
    poll = stepper(fanout, clock, T0)
    poll()
    others = [b for b in range(BUCKETS) if b != 3]
    assert sorted(invokes.buckets()) == others
    tokens = {c["bucket"]: c["token"] for c in invokes.calls}
    assert all(marker(conn, b) == tokens[b] for b in others)  # each marker has its invoke
    assert sick.refused  # the failure did happen

    sick.sick.clear()
    poll()
    assert sorted(invokes.buckets()) == list(range(BUCKETS))


# ---------------------------------------------------------------- what the trigger can run


def test_the_fanout_starts_no_more_runs_than_the_trigger_can_run_at_once(
    deps: FanoutDeps, clock: FakeClock, invokes: Invokes, index: BucketIndex, conn: redis.Redis
) -> None:
    """Issue 36: in a hot second the fan-out wanted 8 runs for each of 8 buckets while the local
    stack runs 8 sandboxes: invokes waited up to 61 s and were dropped. A run beyond what the
    trigger can run at once (its reserved concurrency) only waits in Lambda's queue and leases
    nothing by the time it starts: the fan-out starts none - a first run for each due bucket
    (smallest backlog first), then more for a backlog - and a queued run keeps its slot past
    START_TTL_MS while it waits for a sandbox."""
    for bucket in range(6):
        add(index, bucket, 3 * PER_TRIGGER if bucket == 5 else 1 + bucket, T0)
    fanout = Fanout(replace(deps, concurrency=4))
    act_at(fanout, clock, T0)
    assert sorted(c["bucket"] for c in invokes.calls) == [0, 1, 2, 3]  # the smallest first
    assert fanout.report.held_back > 0

    queued = list(invokes.calls)
    act_at(fanout, clock, *range(T0 + POLL_MS, T0 + 2 * START_TTL_MS, POLL_MS))
    assert invokes.calls == queued  # still queued: nothing more, not again
    assert all(marker(conn, c["bucket"]) == c["token"] for c in queued)  # kept past its TTL

    assert index.lease(0, T0, FAR, 10).cards  # bucket 0's run took its card, and ends:
    run_ended(index, queued[0])  # one more may start - bucket 4's first
    act_at(fanout, clock, T0 + 2 * START_TTL_MS)
    assert [c["bucket"] for c in invokes.calls[4:]] == [4]


def test_the_first_run_of_every_due_bucket_comes_before_a_backlogs_second(
    deps: FanoutDeps, clock: FakeClock, invokes: Invokes, index: BucketIndex
) -> None:
    add(index, 6, MAX_PARALLEL * PER_TRIGGER, T0)  # would take eight runs on its own
    for bucket in (1, 2, 3):
        add(index, bucket, 1, T0)
    fanout = Fanout(replace(deps, concurrency=5))
    act_at(fanout, clock, T0)
    assert Counter(c["bucket"] for c in invokes.calls) == {6: 2, 1: 1, 2: 1, 3: 1}


def test_a_finishing_run_frees_its_slot_and_still_counts_among_the_runs_in_flight(
    deps: FanoutDeps, clock: FakeClock, invokes: Invokes, index: BucketIndex, conn: redis.Redis
) -> None:
    """A run that leases no more marks itself finishing (``~``): another run of its bucket may
    start at once, while the finishing one - still sending, in its sandbox - is counted (until
    its slot is another run's: then its marker, and what the fan-out knows of it, are gone)."""
    add(index, 3, 1, T0)
    fanout = Fanout(replace(deps, concurrency=2))
    act_at(fanout, clock, T0)
    (first,) = invokes.calls
    assert index.touch_run(3, 0, first["token"], 60_000, T0 + RUN_BEAT_MS)  # it started,
    assert index.lease(3, T0, FAR, 10).cards  # took its card
    assert index.finishing_run(3, 0, first["token"], 60_000)  # ... and leases no more
    add(index, 3, 1, T0 + 200)  # due meanwhile
    add(index, 4, 2, T0 + 200)
    add(index, 5, 2, T0 + 200)
    act_at(fanout, clock, T0 + 200)
    assert [(c["bucket"], c["slot"]) for c in invokes.calls[1:]] == [(3, 0)]  # one more: 1 + 1
    assert marker(conn, 3) == invokes.calls[1]["token"]
    assert not index.end_run(3, 0, first["token"])  # the first's end leaves the new marker be


# ---------------------------------------------------------------- runs over time


INVOKE_MS = 30  # an async invoke's way to a warm sandbox


def test_overlapping_fanouts_never_start_a_bucket_twice(
    deps: FanoutDeps, clock: FakeClock, invokes: Invokes, index: BucketIndex
) -> None:
    """Two fan-out runs overlap (the next minute's started early, its polls 7 ms off the
    first's), and the first dies midway. Each trigger run lands INVOKE_MS after its invoke,
    marks itself going, leases what falls due within ARM_MS, records it and ends. No bucket is
    ever invoked while a run of it is queued or going, every card is taken once and before its
    due time, and both fan-outs dispatched."""
    cards = [c for i in range(40) for c in add(index, i % BUCKETS, 1, T0 + 300 + 97 * i)]
    dies = T0 + 2_000
    fanouts = {"first": Fanout(deps), "second": Fanout(deps)}
    steps = {
        "first": fanouts["first"].steps(T0, T0 + 60_000),
        "second": fanouts["second"].steps(T0 + 1_007, T0 + 61_007),
    }
    wakes = {name: next(s) for name, s in steps.items()}
    queued: list[tuple[int, dict[str, Any]]] = []  # (lands at, payload)
    going: dict[int, str] = {}  # bucket -> token of its run queued or going
    taken: list[tuple[Card, int]] = []
    twice: list[int] = []  # buckets invoked while a run of theirs was queued or going
    lock = threading.Lock()

    def landed(payload: dict[str, Any]) -> None:  # in the fan-out's invoke threads
        with lock:
            if payload["bucket"] in going:
                twice.append(payload["bucket"])
            going[payload["bucket"]] = payload["token"]
            queued.append((clock() + INVOKE_MS, payload))

    invokes.then = landed
    while clock() < T0 + 6_000:
        run_at = min((at for at, _ in queued), default=None)
        name = min(wakes, key=lambda n: wakes[n])
        if run_at is not None and run_at <= wakes[name]:
            clock.now = run_at
            (at, payload), *_ = sorted(queued, key=lambda q: q[0])
            queued.remove((at, payload))
            bucket, slot, token = payload["bucket"], payload["slot"], payload["token"]
            index.touch_run(bucket, slot, token, 60_000)  # as run_trigger: the result unread
            got = index.lease(bucket, clock() + ARM_MS, FAR, 10_000)
            index.settle(bucket, [(c, None, c.timer.rev) for c in got.cards])
            taken += [(c, clock()) for c in got.cards]
            with lock:
                going.pop(bucket, None)
            index.end_run(bucket, slot, token)
            continue
        clock.now = max(clock(), wakes[name])
        wakes[name] = next(steps[name])  # acts at the instant it named, then names the next
        if name == "first" and clock() >= dies:
            del wakes[name]  # killed between two polls

    assert twice == []
    assert sorted(c.member for c, _ in taken) == sorted(c.member for c in cards)
    for c, at in taken:
        assert c.pos - LEAD_MS - ARM_MS <= at <= c.pos  # leased ahead of its due time
    tokens = Counter(c["token"].rsplit("-", 1)[0] for c in invokes.calls)  # the fan-outs'
    assert set(tokens) == {fanouts["first"].token, fanouts["second"].token}
    assert fanouts["first"].report.busy + fanouts["second"].report.busy > 0  # they did contend
    assert sum(tokens.values()) <= len(cards)


def test_run_fanout_polls_until_its_deadline(
    deps: FanoutDeps, clock: FakeClock, invokes: Invokes, index: BucketIndex
) -> None:
    trigger = FakeTrigger(index)
    invokes.then = trigger
    (c,) = add(index, 7, 1, T0 + 610)
    report = run_fanout(deps, T0, T0 + 2_000)

    assert clock() == T0 + 2_000  # slept (on the fake clock) to each poll, not beyond
    assert (report.polls, report.errors, report.restores) == (21, 0, 0)
    assert [(x.member, at) for x, at in trigger.taken] == [
        (c.member, T0 + 500)
    ]  # the first poll with T0 + 610 within the lead
    assert report.invocations == 1


@pytest.mark.parametrize("client_class", [redis.RedisCluster, redis.Redis])
def test_a_run_works_on_a_cluster_mode_server(
    redis_cluster_url: str,
    client_class: type[redis.Redis] | type[redis.RedisCluster],
    clock: FakeClock,
    invokes: Invokes,
) -> None:
    """ElastiCache Serverless speaks cluster mode: peeks, markers, fields and scripts route."""
    client: Any = client_class.from_url(redis_cluster_url, decode_responses=True)
    try:
        client.flushall()
        client.script_flush()
        index = BucketIndex(client, BUCKETS)
        whole(index)
        client.hdel(keys.data(6), keys.SENTINEL)  # one bucket lost
        trigger = FakeTrigger(index)
        invokes.then = trigger
        added = add(index, 3, 2, T0 + 300) + add(index, 5, 1, T0 + 700)
        report = run_fanout(make_deps(index, clock, invokes), T0, T0 + 1_000)
        assert (report.errors, report.invocations, report.polls) == (0, 2, 11)
        assert sorted(invokes.buckets()) == [3, 5]
        assert sorted(c.member for c, _ in trigger.taken) == sorted(c.member for c in added)
        assert invokes.restores == [[6]]
    finally:
        client.close()


# ---------------------------------------------------------------- cold buckets start earlier


COLD_MS = 700  # a measured cold start (invoke -> handler)
COLD_LEAD = COLD_HEADROOM * COLD_MS  # a cold bucket's run starts this much earlier than warm


def test_a_cold_bucket_is_invoked_earlier_by_its_measured_cold_start(
    deps: FanoutDeps,
    clock: FakeClock,
    invokes: Invokes,
    index: BucketIndex,
    conn: redis.Redis,
) -> None:
    due = T0 + 5_000
    cold(conn, 3)  # bucket 3 never ran: its sandboxes are likely cold
    index.set_field(3, keys.COLD, COLD_MS)  # as its trigger measured
    add(index, 3, 1, due)
    fanout = Fanout(deps)
    act_at(fanout, clock, T0, due - LEAD_MS - COLD_LEAD - 1)
    assert invokes.calls == []

    act_at(fanout, clock, due - LEAD_MS - COLD_LEAD)
    assert [(c["bucket"], c["at_ms"]) for c in invokes.calls] == [(3, due - LEAD_MS - COLD_LEAD)]
    assert (fanout.report.invocations, fanout.report.cold_invocations) == (1, 1)
    assert index.field(3, keys.RAN) == str(due - LEAD_MS - COLD_LEAD)  # a later run knows


def test_each_bucket_leads_by_its_own_estimate(
    deps: FanoutDeps,
    clock: FakeClock,
    invokes: Invokes,
    index: BucketIndex,
    conn: redis.Redis,
) -> None:
    due = T0 + 5_050  # both leads fall on the poll grid
    cold(conn, 2, 3)
    index.set_field(2, keys.COLD, COLD_MS)
    index.set_field(3, keys.COLD, 2 * COLD_MS)
    add(index, 2, 1, due)
    add(index, 3, 1, due)
    fanout = Fanout(deps)
    act_at(fanout, clock, *range(T0, due, POLL_MS))
    assert [(c["bucket"], c["at_ms"]) for c in invokes.calls] == [
        (3, due - LEAD_MS - 2 * COLD_LEAD),
        (2, due - LEAD_MS - COLD_LEAD),
    ]


def test_a_bucket_that_ran_recently_keeps_the_warm_lead(
    deps: FanoutDeps,
    clock: FakeClock,
    invokes: Invokes,
    index: BucketIndex,
    conn: redis.Redis,
) -> None:
    due = T0 + 5_000
    index.set_field(3, keys.RAN, due - LEAD_MS - COLD_AFTER_MS)  # still warm when its lead comes
    index.set_field(3, keys.COLD, COLD_MS)
    add(index, 3, 1, due)
    fanout = Fanout(deps)
    act_at(fanout, clock, T0, due - LEAD_MS - COLD_LEAD, due - LEAD_MS - 1)
    assert invokes.calls == []
    act_at(fanout, clock, due - LEAD_MS)
    assert [(c["bucket"], c["at_ms"]) for c in invokes.calls] == [(3, due - LEAD_MS)]
    assert fanout.report.cold_invocations == 0


def test_a_bucket_idle_past_COLD_AFTER_MS_counts_cold_again(
    deps: FanoutDeps,
    clock: FakeClock,
    invokes: Invokes,
    index: BucketIndex,
    conn: redis.Redis,
) -> None:
    due = T0 + 5_000
    index.set_field(3, keys.RAN, due - LEAD_MS - COLD_LEAD - COLD_AFTER_MS - 1)
    index.set_field(3, keys.COLD, COLD_MS)
    add(index, 3, 1, due)
    fanout = Fanout(deps)
    act_at(fanout, clock, T0, due - LEAD_MS - COLD_LEAD)
    assert [c["at_ms"] for c in invokes.calls] == [due - LEAD_MS - COLD_LEAD]


def test_until_a_cold_start_is_measured_the_default_estimate_leads(
    deps: FanoutDeps,
    clock: FakeClock,
    invokes: Invokes,
    index: BucketIndex,
    conn: redis.Redis,
) -> None:
    due = T0 + 10_000
    cold(conn, 3)
    add(index, 3, 1, due)
    fanout = Fanout(deps)
    lead = LEAD_MS + COLD_HEADROOM * DEFAULT_COLD_START_MS
    act_at(fanout, clock, T0, due - lead - 1)
    assert invokes.calls == []
    act_at(fanout, clock, due - lead)
    assert [c["at_ms"] for c in invokes.calls] == [due - lead]


def test_runs_are_wanted_for_the_backlog_due_within_LEAD_MS_only(
    deps: FanoutDeps,
    clock: FakeClock,
    invokes: Invokes,
    index: BucketIndex,
    conn: redis.Redis,
) -> None:
    """Cards due later (within a cold lead) must not ask for parallel runs not needed yet."""
    cold(conn, 5)
    index.set_field(5, keys.COLD, COLD_MS)
    add(index, 2, 1, T0 + LEAD_MS)
    add(index, 2, PER_TRIGGER, T0 + LEAD_MS + COLD_LEAD)  # beyond the warm lead
    add(index, 5, 2 * PER_TRIGGER, T0 + LEAD_MS + COLD_LEAD)  # cold: due now, counted later
    fanout = Fanout(deps)
    act_at(fanout, clock, T0)
    assert sorted((c["bucket"], c["slot"]) for c in invokes.calls) == [(2, 0), (5, 0)]


def test_an_early_cold_run_that_finds_nothing_yet_is_started_again_warm_in_time(
    deps: FanoutDeps,
    clock: FakeClock,
    invokes: Invokes,
    index: BucketIndex,
    conn: redis.Redis,
) -> None:
    """The estimate was high: the run came up before its cards were leasable and ended. The
    bucket now counts warm, so the next start is LEAD_MS ahead, not later."""
    trigger = FakeTrigger(index)
    invokes.then = trigger  # a run that happens at its invocation: as early as can be
    due = T0 + 5_050  # both leads fall on the poll grid
    cold(conn, 4)
    index.set_field(4, keys.COLD, COLD_MS)
    (c,) = add(index, 4, 1, due)
    fanout = Fanout(deps)
    act_at(fanout, clock, *range(T0, due, POLL_MS))
    assert [x["at_ms"] for x in invokes.calls] == [due - LEAD_MS - COLD_LEAD, due - LEAD_MS]
    assert [(x.member, at) for x, at in trigger.taken] == [(c.member, due - LEAD_MS)]
    assert (fanout.report.invocations, fanout.report.cold_invocations) == (2, 1)


def test_a_later_fanout_run_knows_which_buckets_ran(
    deps: FanoutDeps,
    clock: FakeClock,
    invokes: Invokes,
    index: BucketIndex,
    conn: redis.Redis,
) -> None:
    invokes.then = FakeTrigger(index)
    cold(conn, 5)
    index.set_field(5, keys.COLD, COLD_MS)
    first = Fanout(deps)
    add(index, 5, 1, T0 + 100)
    act_at(first, clock, T0)

    due = T0 + 10_000
    add(index, 5, 1, due)
    second = Fanout(deps)  # the next minute's run, in another sandbox
    act_at(second, clock, T0 + 1_000, due - LEAD_MS - COLD_LEAD, due - LEAD_MS)
    assert [c["at_ms"] for c in invokes.calls] == [T0, due - LEAD_MS]


def test_a_buckets_run_is_written_to_redis_at_most_every_RAN_WRITE_MS(
    deps: FanoutDeps,
    clock: FakeClock,
    invokes: Invokes,
    index: BucketIndex,
    conn: redis.Redis,
) -> None:
    invokes.then = FakeTrigger(index)
    cold(conn, 5)
    fanout = Fanout(deps)
    for at in (T0, T0 + RAN_WRITE_MS - POLL_MS, T0 + RAN_WRITE_MS):
        add(index, 5, 1, at)
        act_at(fanout, clock, at)
        assert [c["at_ms"] for c in invokes.calls][-1] == at
        assert index.field(5, keys.RAN) == str(T0 if at < T0 + RAN_WRITE_MS else at)


def test_the_estimate_is_a_decaying_peak_folded_into_its_bucket_by_the_trigger(
    index: BucketIndex, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(trigger_app, "wired", lambda: (SimpleNamespace(index=index), None))
    samples = [900, 400, 400, 2_500, 600, 10_000, -3, 700]
    expected: list[int] = []
    previous: int | None = None
    for s in samples:
        previous = next_cold_estimate(previous, s)
        expected.append(previous)
    assert expected[:4] == [900, 775, 681, 2_500]  # down a quarter of the gap; up at once
    assert max(expected) == MAX_COLD_START_MS and min(expected) >= 0
    folded = []
    for s in samples:
        trigger_app.record_cold_start(3, s)
        folded.append(int(index.field(3, keys.COLD) or -1))
    assert folded == expected
    assert index.field(2, keys.COLD) is None  # each bucket has its own

"""The fan-out against a real redis-server, with a fake clock and a recorder for Lambda invokes.

Guards invariant 2 (never lost) on the fan-out's side: every second boundary is ticked by
exactly one run, overlapping or late runs leave no gap, a dead run is replaced within the lock
TTL; and invariant 1 (never early): a bucket is invoked only once its members are due.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

import pytest
import redis

from functions.fanout import app as fanout_app
from ops.local.context import LambdaContext
from tests.support.clock import T0, FakeClock
from timers.fanout import (
    LOCK_KEY,
    LOCK_TTL_MS,
    MARKER_KEY,
    MAX_RUN_MS,
    STOP_MARGIN_MS,
    TICK_MS,
    Fanout,
    FanoutDeps,
    next_boundary,
    run_deadline,
    run_fanout,
    slices,
)
from timers.redis_index import Lock, RedisIndex, bucket_of

pytestmark = pytest.mark.integration

EVENTS = Path(__file__).resolve().parents[2] / "events"
BUCKETS = 8
TRIGGER = "timers-trigger"


@dataclass
class InvokeRecorder:
    """Stands in for boto3's Lambda client: records each async invoke and when it happened."""

    clock: FakeClock
    calls: list[dict[str, Any]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def invoke(self, **kwargs: Any) -> dict[str, int]:
        assert kwargs["FunctionName"] == TRIGGER
        assert kwargs["InvocationType"] == "Event"
        with self._lock:
            self.calls.append({**json.loads(kwargs["Payload"]), "at_ms": self.clock()})
        return {"StatusCode": 202}

    def buckets(self) -> list[int]:
        return sorted(c["bucket"] for c in self.calls)


@pytest.fixture
def recorder(clock: FakeClock) -> InvokeRecorder:
    return InvokeRecorder(clock)


def make_deps(
    client: redis.Redis, clock: FakeClock, recorder: InvokeRecorder, **overrides: Any
) -> FanoutDeps:
    deps = FanoutDeps(
        index=RedisIndex(client, BUCKETS),
        lock=Lock(client, LOCK_KEY, LOCK_TTL_MS),
        marker=client,
        invoke=recorder.invoke,
        trigger_function=TRIGGER,
        clock=clock,
        sleep=lambda seconds: sleep_on(clock, seconds),
    )
    return replace(deps, **overrides)


def sleep_on(clock: FakeClock, seconds: float) -> None:
    """The injected sleeper: it advances the fake clock instead of waiting."""
    clock.advance(round(seconds * 1000))


@pytest.fixture
def deps(redis_client: redis.Redis, clock: FakeClock, recorder: InvokeRecorder) -> FanoutDeps:
    return make_deps(redis_client, clock, recorder)


def timer_ids_in(bucket: int, n: int) -> list[str]:
    ids = (f"tmr_{i}" for i in range(100_000))
    found = [t for t in ids if bucket_of(t, BUCKETS) == bucket]
    return found[:n]


def fill(index: RedisIndex, bucket: int, n: int, due_ms: int) -> None:
    index.add([("acme", t, due_ms) for t in timer_ids_in(bucket, n)])


# ---------------------------------------------------------------- pure decisions


@pytest.mark.parametrize(
    ("now", "after", "expected"),
    [
        (T0, None, T0),  # on a boundary: tick it
        (T0 + 1, None, T0 + 1_000),
        (T0 + 999, None, T0 + 1_000),
        (T0, T0, T0 + 1_000),  # never the same boundary twice
        (T0 + 2_500, T0, T0 + 3_000),  # an overrun skips to the next boundary
        (T0 + 200, T0 + 1_000, T0 + 2_000),
    ],
)
def test_next_boundary(now: int, after: int | None, expected: int) -> None:
    assert next_boundary(now, after) == expected


@pytest.mark.parametrize(
    ("counts", "per_trigger", "expected"),
    [
        ({}, 500, []),
        ({3: 1}, 500, [3]),
        ({3: 500}, 500, [3]),
        ({3: 501}, 500, [3, 3]),
        ({5: 1_001, 1: 7}, 500, [1, 5, 5, 5]),
    ],
)
def test_slices_are_ceil_count_over_per_trigger(
    counts: dict[int, int], per_trigger: int, expected: list[int]
) -> None:
    assert slices(counts, per_trigger) == expected


@pytest.mark.parametrize(
    ("remaining", "expected"),
    [
        (75_000, MAX_RUN_MS),  # a fresh 75 s Lambda: a minute plus overlap
        (30_000, 30_000 - STOP_MARGIN_MS),  # a short timeout leaves the margin free
        (1_000, 0),
    ],
)
def test_run_deadline(remaining: int, expected: int) -> None:
    assert run_deadline(T0, remaining) == T0 + expected


# ---------------------------------------------------------------- one tick


def test_only_buckets_with_due_work_are_invoked_and_a_big_bucket_in_slices(
    deps: FanoutDeps, redis_client: redis.Redis, recorder: InvokeRecorder
) -> None:
    index = RedisIndex(redis_client, BUCKETS)
    fill(index, 1, 3, T0 - 5_000)  # overdue
    fill(index, 4, 25, T0)  # due exactly now
    fill(index, 6, 2, T0 + 1)  # not yet due: never early
    report = run_fanout(replace(deps, per_trigger=10), T0, T0)

    assert report.ticked == [T0]
    assert recorder.buckets() == [1, 4, 4, 4]  # ceil(25 / 10) slices for bucket 4
    assert {c["tick_ms"] for c in recorder.calls} == {T0}
    assert (report.due, report.invocations) == (28, 4)


def test_a_member_due_between_boundaries_is_invoked_at_the_next_one(
    deps: FanoutDeps, redis_client: redis.Redis, recorder: InvokeRecorder
) -> None:
    fill(RedisIndex(redis_client, BUCKETS), 2, 1, T0 + 1_500)
    run_fanout(deps, T0, T0 + 3_000)
    assert [(c["bucket"], c["tick_ms"]) for c in recorder.calls] == [
        (2, T0 + 2_000),
        (2, T0 + 3_000),
    ]
    assert all(c["tick_ms"] <= c["at_ms"] for c in recorder.calls)  # never early


def test_due_counts_is_one_round_trip_per_tick(
    redis_url: str, redis_client: redis.Redis, clock: FakeClock, recorder: InvokeRecorder
) -> None:
    pool = redis.ConnectionPool.from_url(redis_url, connection_class=CountingConnection)
    counting = redis.Redis(connection_pool=pool)
    counting.ping()
    index = RedisIndex(counting, BUCKETS)
    for bucket in range(BUCKETS):
        fill(index, bucket, 3, T0)
    deps = replace(make_deps(redis_client, clock, recorder), index=index)  # lock apart
    CountingConnection.sent = 0

    report = run_fanout(deps, T0, T0 + 4_000)

    assert report.ticks == 5
    assert CountingConnection.sent == 5  # all buckets of a tick in one pipeline
    assert len(recorder.calls) == 5 * BUCKETS
    pool.disconnect()


class CountingConnection(redis.Connection):
    """Counts writes to the server: a pipeline is one write, so this counts round trips."""

    sent: ClassVar[int] = 0

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        CountingConnection.sent += 1
        super().send_packed_command(command, check_health)


def test_a_failed_invoke_is_counted_and_retried_next_tick(
    deps: FanoutDeps, redis_client: redis.Redis, recorder: InvokeRecorder
) -> None:
    fill(RedisIndex(redis_client, BUCKETS), 3, 1, T0)
    failures = iter([RuntimeError("throttled")])

    def flaky(**kwargs: Any) -> Any:
        if (error := next(failures, None)) is not None:
            raise error
        return recorder.invoke(**kwargs)

    report = run_fanout(replace(deps, invoke=flaky), T0, T0 + 1_000)
    assert (report.failed_invocations, report.invocations) == (1, 1)
    assert [c["tick_ms"] for c in recorder.calls] == [T0 + 1_000]


# ---------------------------------------------------------------- one run


def test_one_tick_per_second_boundary_over_the_window_then_release(
    deps: FanoutDeps, clock: FakeClock, redis_client: redis.Redis
) -> None:
    clock.now = T0 + 400
    report = run_fanout(deps, clock(), T0 + 10_000)
    assert report.ticked == [T0 + s * 1_000 for s in range(1, 11)]
    assert report.skipped == 0
    assert clock() == T0 + 10_000  # slept to each boundary, not beyond the deadline
    assert redis_client.get(LOCK_KEY) is None  # released for the next run


def test_a_slow_tick_skips_missed_boundaries_without_ticking_them_late(
    deps: FanoutDeps, clock: FakeClock, redis_client: redis.Redis, recorder: InvokeRecorder
) -> None:
    fill(RedisIndex(redis_client, BUCKETS), 0, 1, T0)

    def slow(**kwargs: Any) -> Any:
        clock.advance(1_500)  # an invoke that overruns the second
        return recorder.invoke(**kwargs)

    report = run_fanout(replace(deps, invoke=slow), T0, T0 + 5_000)
    assert report.ticked == [T0, T0 + 2_000, T0 + 4_000]
    assert report.errors == 0


def test_a_late_starting_run_ticks_at_once(deps: FanoutDeps, clock: FakeClock) -> None:
    """No run for minutes (a stale marker remains): the next one ticks its first boundary."""
    assert run_fanout(deps, T0, T0 + 2_000).ticks == 3
    clock.now = T0 + 5 * 60_000 + 37_400
    report = run_fanout(deps, clock(), clock() + 5_000)
    assert report.ticked[0] == T0 + 5 * 60_000 + 38_000
    assert report.ticks == 5


def test_redis_errors_cost_a_tick_not_the_run(
    deps: FanoutDeps, redis_client: redis.Redis, recorder: InvokeRecorder
) -> None:
    fill(RedisIndex(redis_client, BUCKETS), 5, 1, T0)
    real = deps.index
    calls = iter([True])

    class Flaky:
        bucket_count = BUCKETS

        def due_counts(self, buckets: Sequence[int], now_ms: int) -> dict[int, int]:
            if next(calls, False):
                raise redis.ConnectionError("failover")
            return real.due_counts(buckets, now_ms)

    report = run_fanout(replace(deps, index=Flaky()), T0, T0 + 2_000)
    assert report.errors == 1
    assert [c["tick_ms"] for c in recorder.calls] == [T0 + 1_000, T0 + 2_000]


# ---------------------------------------------------------------- overlapping runs


@dataclass
class SimRun:
    """A run in the simulation: its fan-out, its step iterator and the instant it waits for."""

    name: str
    fanout: Fanout
    steps: Iterator[int]
    wake: int
    dies_after: int | None = None  # stops after ticking this boundary, without releasing


def start(name: str, deps: FanoutDeps, start_ms: int, deadline_ms: int, **kw: Any) -> SimRun:
    fanout = Fanout(deps)
    steps = fanout.steps(start_ms, deadline_ms)
    return SimRun(name, fanout, steps, next(steps), **kw)


def simulate(clock: FakeClock, client: redis.Redis, runs: list[SimRun]) -> None:
    """Step every run in wake order on one fake clock (ties: list order), like concurrent
    Lambdas. Redis expires keys on its own (real) clock, so a dead holder's lock is deleted here
    once the fake clock passes its TTL from the last renew."""
    active = list(runs)
    lock_dies_at: int | None = None
    while active:
        run = min(active, key=lambda r: r.wake)  # min is stable: ties go to the earlier run
        clock.now = max(clock.now, run.wake)
        if lock_dies_at is not None and clock.now > lock_dies_at:
            assert 0 < client.pttl(LOCK_KEY) <= LOCK_TTL_MS  # it would expire on its own
            client.delete(LOCK_KEY)
            lock_dies_at = None
        ticked = run.wake
        try:
            run.wake = next(run.steps)
        except StopIteration:
            run.fanout.release()
            active.remove(run)
            continue
        if run.dies_after is not None and ticked >= run.dies_after:
            active.remove(run)  # crashed: no release, the lock lives until its TTL
            lock_dies_at = ticked + LOCK_TTL_MS


def all_ticks(runs: list[SimRun]) -> Counter[int]:
    return Counter(t for r in runs for t in r.fanout.report.ticked)


@pytest.mark.parametrize("first_wins_ties", [True, False])
def test_overlapping_runs_tick_each_second_exactly_once(
    deps: FanoutDeps, clock: FakeClock, redis_client: redis.Redis, first_wins_ties: bool
) -> None:
    """Minute 1's run ends at +70 s; minute 2's started at +60.3 s and takes over with no gap."""
    first = start("first", deps, T0, T0 + 70_000)
    second = start("second", deps, T0 + 60_300, T0 + 130_300)
    runs = [first, second] if first_wins_ties else [second, first]
    simulate(clock, redis_client, runs)

    ticks = all_ticks(runs)
    assert set(ticks) == {T0 + s * TICK_MS for s in range(131)}  # no gap
    assert set(ticks.values()) == {1}  # no double tick
    assert first.fanout.report.ticked[-1] == T0 + 70_000
    assert second.fanout.report.ticked[0] == T0 + 71_000
    assert second.fanout.report.skipped >= 9  # waited while the first held the lock


def test_a_crashed_holder_is_replaced_within_the_lock_ttl(
    deps: FanoutDeps, clock: FakeClock, redis_client: redis.Redis
) -> None:
    dies_at = T0 + 30_000
    first = start("first", deps, T0, T0 + 70_000, dies_after=dies_at)
    second = start("second", deps, T0 + 10_200, T0 + 80_200)
    runs = [first, second]
    simulate(clock, redis_client, runs)

    ticks = all_ticks(runs)
    assert set(ticks.values()) == {1}
    missed = {T0 + s * TICK_MS for s in range(81)} - set(ticks)
    assert missed == {dies_at + TICK_MS, dies_at + 2 * TICK_MS}  # LOCK_TTL_MS of silence
    assert len(missed) * TICK_MS <= LOCK_TTL_MS
    assert second.fanout.report.ticked[0] == dies_at + 3 * TICK_MS


def test_a_holder_that_stalls_past_its_ttl_hands_over_without_double_ticks(
    redis_client: redis.Redis, clock: FakeClock, recorder: InvokeRecorder
) -> None:
    """A tick overrunning the TTL lets the other run take over; the stalled one steps back."""
    fill(RedisIndex(redis_client, BUCKETS), 0, 1, T0)
    stalls = iter([True])

    def stalling(**kwargs: Any) -> Any:
        if next(stalls, False):  # first invoke: stall, and Redis expires the lock meanwhile
            clock.advance(LOCK_TTL_MS + 500)
            redis_client.delete(LOCK_KEY)
        return recorder.invoke(**kwargs)

    first = start(
        "first", make_deps(redis_client, clock, recorder, invoke=stalling), T0, T0 + 10_000
    )
    second = start("second", make_deps(redis_client, clock, recorder), T0, T0 + 10_000)
    runs = [first, second]
    simulate(clock, redis_client, runs)

    ticks = all_ticks(runs)
    assert set(ticks.values()) == {1}
    assert first.fanout.report.ticked == [T0]
    assert second.fanout.report.ticked[0] == T0 + 3_000  # the boundary after the stall
    assert sorted(ticks) == [T0] + [T0 + s * TICK_MS for s in range(3, 11)]


# ---------------------------------------------------------------- the handler


def test_handler_ticks_until_its_deadline_and_releases(
    deps: FanoutDeps, clock: FakeClock, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fanout_app, "deps", lambda: deps)
    event = json.loads((EVENTS / "fanout.json").read_text())
    context = LambdaContext(function_name="fanout", timeout_s=75)

    summary = fanout_app.handler(event, context)

    # remaining ~75 s: the run stops after MAX_RUN_MS (~70 ticks, real ms may shave one off)
    assert MAX_RUN_MS // TICK_MS <= summary["ticks"] <= MAX_RUN_MS // TICK_MS + 1
    assert clock() <= T0 + MAX_RUN_MS
    assert redis_client.get(LOCK_KEY) is None
    assert int(redis_client.get(MARKER_KEY) or 0) == T0 + (summary["ticks"] - 1) * TICK_MS


# ---------------------------------------------------------------- cluster mode


@pytest.mark.parametrize("client_class", [redis.RedisCluster, redis.Redis])
def test_a_run_works_on_a_cluster_mode_server(
    redis_cluster_url: str,
    client_class: type[redis.Redis] | type[redis.RedisCluster],
    clock: FakeClock,
    recorder: InvokeRecorder,
) -> None:
    """ElastiCache Serverless speaks cluster mode: lock, marker and due_counts must route."""
    client: Any = client_class.from_url(redis_cluster_url)
    try:
        client.flushall()
        fill(RedisIndex(client, BUCKETS), 3, 2, T0)
        report = run_fanout(make_deps(client, clock, recorder), T0, T0 + 1_000)
        assert report.ticked == [T0, T0 + 1_000]
        assert (report.errors, recorder.buckets()) == (0, [3, 3])
        assert client.get(LOCK_KEY) is None
    finally:
        client.close()

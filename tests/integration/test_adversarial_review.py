"""The adversarial review of this session's fire path: six defects, each proven by a test
that failed while it existed; each test now holds with its fix.

1. A trigger run that does not trust its clock (a slow Redis TIME, a host clock off), or whose
   first TIME read raises, clears its run marker: the next poll starts a run for the bucket
   (it used to stay queued for MAX_QUEUED_MS: no run for a minute).
2. The fair queue forgets a tenant's last tag once its queued members left by a change
   (delete, PATCH, pause): its next fire joins at the queue's head, not behind what it had.
3. A takeover of a fire whose window grew (an adopted claim's send instant far away) is not
   waited for past the run's deadline.
4. A Redis error in the claim step's settles comes after the fresh claims joined the pending:
   the hand-back releases them (they used to wait for their claims to lapse, ~32 s).
5. A PATCH of a bound (max_fires, end_at, start_at) keeps the windowed fires already due and
   waiting for their send instant (they used to be skipped: lost).
6. Every record write of a send (every chunk of every item) starts at once, so one record's
   worst case - what a send reserves - covers them all (a second chunk of one item used to
   find no time: its 50 sent fires were sent again).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import pytest
import redis

from tests.integration import test_fire_path as fire_path
from tests.integration.api_harness import Api, make_api
from tests.integration.test_engine_index import card, many
from tests.integration.test_trigger import (  # noqa: F401 - rig is a fixture
    LAPSE_MS,
    REMAINING_MS,
    Kill,
    Rig,
    kill_at,
    rig,
    until_armed,
    windowed,
)
from tests.support.clock import T0, FakeClock
from tests.support.real_parts import RedisTarget
from timers.core.times import format_ms
from timers.core.window import phase_of, send_at
from timers.engine import keys
from timers.engine.entries import fence, partition_for, ref_of
from timers.engine.index import BucketIndex
from timers.engine.send import drain_usage
from timers.engine.trigger import (
    ARM_MS,
    SEND_RESERVE_MS,
    Pace,
    RunMarker,
    TriggerDeps,
    run_trigger,
)

pytestmark = pytest.mark.integration

TRIGGER_TIMEOUT_MS = 30_000  # template.yaml: the trigger's Timeout


class World(fire_path.World):
    """The deployed shape, poll by poll (test_fire_path's World), with a say in each trigger
    run: ``deps_for(n)`` gives the n-th run's deps (a sick host), and a run that raises is what
    Lambda logs (MaximumRetryAttempts: 0) - the loop goes on."""

    def __init__(self, api: Api) -> None:
        super().__init__(api)
        self.deps_for: Callable[[int], TriggerDeps] = lambda _: self.trigger
        self.raised: list[BaseException] = []

    def start_trigger(self, event: dict[str, Any]) -> None:
        deps = self.deps_for(self.triggers)
        self.triggers += 1
        try:
            run_trigger(deps, event["bucket"], TRIGGER_TIMEOUT_MS,
                        RunMarker(event["slot"], event["token"]))  # fmt: skip
        except Exception as exc:  # Lambda logs it; no retry
            self.raised.append(exc)


@pytest.fixture
def world(
    aws: None, clock: FakeClock, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[World]:
    yield World(make_api(monkeypatch, clock, RedisTarget(redis_url, cluster=False)))


# ---------------------------------------------------------------- 1. a run marker left queued


def test_a_run_that_refuses_its_clock_frees_its_bucket_for_the_next_poll(
    world: World,
) -> None:
    """One sandbox's bad moment (its host clock 3 s off, or one TIME read over a slow round
    trip) should cost one run - the next poll starts another on a sane host - not a minute."""
    timer = world.api.create(schedule={"type": "after", "seconds": 2})
    sane = world.trigger
    sick = replace(sane, clock=lambda: world.clock() + 3_000)  # refused: > MAX_CLOCK_OFFSET_MS
    world.deps_for = lambda n: sick if n == 0 else sane
    world.run_until(T0 + 12_000)  # (Redis TTLs run in real time: 12 s of polls, not 60)
    stuck = {k: world.redis.get(k) for k in world.redis.keys(keys.run(0, 0).replace("b0", "b*"))}
    assert T0 + 2_000 in world.lags(timer["id"]), (
        f"not sent 10 s after its due time: {world.triggers} run(s); the bucket's marker is "
        f"still the refused run's, queued: {stuck!r}"
    )


def test_a_run_whose_first_redis_time_fails_frees_its_bucket_for_the_next_poll(
    world: World,
) -> None:
    timer = world.api.create(schedule={"type": "after", "seconds": 2})
    sane = world.trigger

    def blip() -> int:
        raise redis.exceptions.ConnectionError("Connection reset by peer")

    world.deps_for = lambda n: replace(sane, reference=blip) if n == 0 else sane
    world.run_until(T0 + 12_000)
    assert len(world.raised) == 1
    assert T0 + 2_000 in world.lags(timer["id"]), (
        f"not sent 10 s after its due time: {world.triggers} run(s)"
    )


# ---------------------------------------------------------------- 2. stale fair-queue tags


@pytest.fixture
def index(redis_client: redis.Redis) -> BucketIndex:
    return BucketIndex(redis_client, bucket_count=1)


def test_a_tenant_whose_queued_timers_were_deleted_waits_behind_another_tenants_crowd(
    index: BucketIndex,
) -> None:
    """docs/fire-path.md, Fairness: "while no more tenants have work in a bucket than a lease
    takes, each of them gets a fire in every lease that takes something ... a tenant due after
    a crowd goes out in the lease after it comes due". Two tenants, leases of 10: acme's burst
    of 300 (a mistake, deleted) and globex's crowd of 300 are due together and queued; acme
    deletes its burst; its one real timer, due a second later, waits for all of globex's."""
    end = T0 + 60_000
    burst, crowd = many(300, tenant="acme"), many(300, tenant="globex")
    index.put([*burst, *crowd])
    first = index.lease(0, T0 + 250, end, 10).cards  # a queue: both tenants tagged 0..299
    assert {c.timer.tenant for c in first} == {"acme", "globex"}
    for c in burst:  # acme deletes its burst (DELETE, or a PATCH / pause moving them)
        if c not in first:
            index.drop(c.timer.partition, c.member, c.timer.rev + 1)

    lone = card("acme-real", T0 + 1_000, tenant="acme")
    index.put([lone])
    leases = 0
    while leases < 100:
        leases += 1
        taken = index.lease(0, T0 + 1_000 + 250, end, 10).cards
        if lone in taken:
            break
    assert leases == 1, f"acme's timer went out in lease {leases}, behind globex's crowd"


# ---------------------------------------------------------------- 3. a takeover past the deadline


def test_a_takeover_of_a_fire_whose_window_grew_sleeps_past_the_runs_timeout(
    rig: Rig,  # noqa: F811
) -> None:
    """A run claims a one-shot and dies (its claim pending); a PATCH window_seconds=900 adopts
    the owed fire (R5: the card keeps its lease, its revision and window are the change's).
    Once the claim lapses a run leases the member, takes the claim over - and, its send
    instant now the 900 s window's aligned instant (up to 300 s on), sleeps until then: far
    past its 30 s deadline. In Lambda it is killed at its timeout, and so is the next run
    that takes it over, until the instant comes within a run's life."""
    timer, pos, partition = _claimed_then_widened(rig)
    assert send_at(pos, 900_000, 0, partition) - pos > 250_000

    rig.clock.advance(LAPSE_MS)  # the claim lapsed, the lease ended
    # (fixed: the kept lease is raised to the card's send instant, so the member is leased - and
    # the lapsed claim taken over - only once that instant is within the run's reach; runs are
    # started every second, as the fan-out would, until the owed fire is sent)
    _taken_over_once_within_each_runs_timeout(rig, timer["id"], pos, partition)


def test_a_card_leased_before_its_send_instant_goes_back_to_it_unclaimed(
    rig: Rig,  # noqa: F811
) -> None:
    """The trigger's own guard for finding 3: the same owed fire, its member's score lowered
    below the card's send instant after the change (as the hand-back of a run holding the card
    before the change writes: the old card's send instant). The run that leases it early
    claims nothing and puts it back at its send instant; the run then takes the claim over."""
    timer, pos, partition = _claimed_then_widened(rig)
    bucket = rig.index.bucket_of(partition)
    (member,) = [m for m in rig.index.cards(bucket) if m.endswith(f"|{timer['id']}")]
    rig.index.client.zadd(keys.due(bucket), {member: pos})  # the old card's send instant

    rig.clock.advance(LAPSE_MS)
    started = rig.clock()
    (report,) = rig.run()
    assert (report.early, report.taken_over, rig.sqs.sent) == (1, 0, [])
    assert rig.clock() - started <= ARM_MS
    instant = send_at(pos, 900_000, 0, partition)
    assert rig.index.cards(bucket)[member][0] == instant  # back at its send instant
    _taken_over_once_within_each_runs_timeout(rig, timer["id"], pos, partition)


def _claimed_then_widened(rig: Rig) -> tuple[dict[str, Any], int, int]:  # noqa: F811
    """A one-shot due just after an aligned instant of a 900 s window's grain (the next is
    ~300 s on), claimed by a run that then dies, then PATCHed to window_seconds=900: the owed
    fire adopted. Returns the timer, its due time and its partition."""
    api = rig.api
    timer = api.create(schedule={"type": "after", "seconds": 3_600})
    partition = rig.stored(timer["id"]).partition
    grain = 300_000  # window 900 s: the grain of its send instants
    pos = T0 + phase_of(partition, grain) + 1
    while pos < T0 + 10_000:
        pos += grain
    moved = api.call("PATCH", f"/v1/timers/{timer['id']}",
                     body={"schedule": {"type": "at", "at": format_ms(pos)}})  # fmt: skip
    assert moved.status == 200, moved.body
    rig.clock.now = pos - 60_000
    rig.migrate()  # in Redis (the look-ahead)
    until_armed(rig, pos)
    with pytest.raises(Kill):
        rig.run(hooks=kill_at("claimed"))  # claimed, then the run dies
    patched = api.call("PATCH", f"/v1/timers/{timer['id']}", body={"window_seconds": 900})
    assert patched.status == 200, patched.body
    return timer, pos, partition


def _taken_over_once_within_each_runs_timeout(
    rig: Rig,  # noqa: F811
    timer_id: str,
    pos: int,
    partition: int,
) -> None:
    """A run every second until the owed fire is sent: each ends within its timeout, the claim
    is taken over once, and the fire goes once, within its window and not before its instant."""
    instant = send_at(pos, 900_000, 0, partition)
    reports = []
    while not rig.sqs.sent and rig.clock() < instant + 60_000:
        started = rig.clock()
        for report in rig.run():
            reports.append(report)
            assert rig.clock() - started <= REMAINING_MS, (
                f"the run went on {rig.clock() - started} ms: killed at its {REMAINING_MS} ms "
                "timeout"
            )
        rig.clock.advance(1_000)
    assert sum(r.taken_over for r in reports) == 1
    (sent,) = rig.sqs.sent
    assert sent.fire_id == f"{timer_id}:{pos}"
    assert instant <= sent.at <= pos + 900_000


# ---------------------------------------------------------------- 4. claims not handed back


def test_a_redis_error_settling_a_stale_card_releases_the_fires_claimed_beside_it(
    rig: Rig,  # noqa: F811
) -> None:
    """Two one-shots due together; one's card is stale (a change fenced its position while
    Redis missed the change's fast path). The run claims the other, then drops the stale card:
    Redis fails that one call (a failover's blip). The run hands back what it holds - but the
    fresh claim it just made is not among it: pending until the run's deadline, it goes out
    only when a later run takes it over, ~32 s late, though Redis was back at once."""
    api = rig.api
    fresh = api.create(schedule={"type": "after", "seconds": 1})
    stale = api.create(schedule={"type": "after", "seconds": 1})
    stored = rig.stored(stale["id"])
    key, name = ref_of(stored, T0 + 1_000)
    assert rig.log.claim(key, {name: fence(stored.rev + 1)})  # the change's fence (R5)

    settle = rig.index.settle
    failed: list[bool] = []

    def blip(*args: Any, **kwargs: Any) -> Any:
        if not failed:
            failed.append(True)
            raise redis.exceptions.ConnectionError("Connection reset by peer")
        return settle(*args, **kwargs)

    rig.index.settle = blip  # type: ignore[method-assign]
    until_armed(rig, T0 + 1_000)
    with pytest.raises(redis.exceptions.ConnectionError):
        rig.run()
    assert failed and rig.sqs.sent == []
    while not rig.sqs.sent and rig.clock() < T0 + 60_000:
        rig.clock.advance(100)
        rig.run()
    (sent,) = rig.sqs.sent
    assert sent.fire_id == f"{fresh['id']}:{T0 + 1_000}"
    assert sent.at - sent.scheduled <= 2_000, f"sent {sent.at - sent.scheduled} ms late"


# ---------------------------------------------------------------- 5. a bound PATCH drops fires


def test_a_patch_of_max_fires_keeps_the_windowed_fires_due_and_waiting_for_their_instant(
    rig: Rig,  # noqa: F811
) -> None:
    """Every 60 s with a 900 s window: each fire goes out at its partition's next aligned
    instant (grain 300 s), up to ~5 minutes after its due time - within its window. Two and a
    half minutes in, three fires are due and waiting; the tenant raises max_fires. Those three
    (due before the change, within their windows) must still go; they never do."""
    api = rig.api
    partition = partition_for("acme", "any", 1)  # windowed timers: the tenant's home partition
    grain = 300_000
    aligned = T0 + phase_of(partition, grain)
    while aligned < T0 + 10_000:
        aligned += grain
    first = aligned + 1_000  # its send instant is the next aligned one, ~300 s on
    timer = api.create(schedule={"type": "every", "seconds": 60}, window_seconds=900,
                       start_at=format_ms(first))  # fmt: skip
    stored = rig.stored(timer["id"])
    assert stored.partition == partition and stored.grain_ms == grain
    instant = send_at(first, 900_000, grain, partition)
    assert instant == aligned + grain
    waiting = [first, first + 60_000, first + 120_000]
    assert all(send_at(d, 900_000, grain, partition) == instant for d in waiting)

    rig.clock.now = first + 150_000  # three fires due, waiting for the instant (in windows)
    rig.migrate()
    assert rig.run() == []  # nothing to send before the instant
    patched = api.call("PATCH", f"/v1/timers/{timer['id']}", body={"max_fires": 1_000})
    assert patched.status == 200, patched.body

    rig.clock.now = instant - 200
    for _ in range(40):
        rig.migrate()
        rig.run_until_idle()
        rig.clock.advance(10_000)
    sent = sorted({s.scheduled for s in rig.sqs.sent})
    assert all(s.at <= s.scheduled + 900_000 for s in rig.sqs.sent)
    assert set(waiting) <= set(sent), f"never sent: {sorted(set(waiting) - set(sent))}"


# ---------------------------------------------------------------- 6. two records, one reserved


def test_a_hundred_fires_of_one_claim_item_are_recorded_within_the_one_record_a_send_reserves(
    rig: Rig,  # noqa: F811
) -> None:
    """100 windowed one-shots of a tenant meet at one aligned instant: one run, one claim item
    (the window's point), one lane of ten SendMessageBatch calls. SQS is slow (0.95 s a batch,
    the last 8.5 s - within SQS_CALL_MS, 9 s) and the first record takes 3 s (RECORD_CALL_MS
    is 8.5 s). Every send attempt started with more than SEND_RESERVE_MS left, as designed;
    but 100 entries are two record writes, and the second no longer fits: its 50 fires stay
    pending, lapse, and are taken over and sent again by the next run."""
    (probe,) = windowed(rig, [T0 + 40_000], 1)  # a 1 s window: grain 0.5 s, phase 0
    rig.api.call("DELETE", f"/v1/timers/{probe['id']}")
    instant = T0 + 40_000  # aligned (a whole second)
    made = windowed(rig, [instant] * 50, 1) + windowed(rig, [instant] * 50, 1)
    assert len({ref_of(rig.stored(t["id"]), instant)[0] for t in made}) == 1  # one claim item

    delays = iter([950] * 9 + [8_500])  # the lane's ten batches
    rig.sqs.delay_ms = 0
    send = rig.sqs.send_message_batch
    began: list[int] = []

    def slow_send(*, QueueUrl: str, Entries: Any) -> Any:
        began.append(run_end - rig.clock())
        answer = send(QueueUrl=QueueUrl, Entries=Entries)
        rig.clock.advance(next(delays, 0))
        return answer

    rig.sqs.send_message_batch = slow_send  # type: ignore[method-assign]
    record = rig.log.record
    records: list[int] = []

    def slow_record(key: str, owner: str, entries: Any, release: bool = False) -> Any:
        records.append(len(entries))
        if len(records) == 1:
            rig.clock.advance(3_000)
        return record(key, owner, entries, release)

    rig.log.record = slow_record  # type: ignore[method-assign]
    until_armed(rig, instant)
    run_end = rig.clock() + REMAINING_MS
    (report,) = rig.run(pace=Pace())
    assert report.enqueued == 100 and len(began) == 10
    assert min(began) > SEND_RESERVE_MS  # every attempt started as the guard allows
    unrecorded = report.unrecorded
    rig.sqs.send_message_batch = send  # type: ignore[method-assign]
    rig.log.record = record  # type: ignore[method-assign]
    rig.clock.advance(LAPSE_MS)
    rig.run_until_idle()
    drain_usage()
    twice = {f for f, n in rig.per_fire().items() if n > 1}
    assert not twice, (
        f"{len(twice)} fires sent twice ({unrecorded} left unrecorded; records: {records})"
    )

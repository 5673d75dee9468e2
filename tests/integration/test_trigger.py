"""The trigger against moto (DynamoDB, SQS) and a real redis-server, time injected.

Sleeping advances the fake clock, so an armed run really "waits" for a due instant. Every send
is recorded with the reference time it happened at (what SQS's SentTimestamp shows a consumer).

Which test guards which invariant (pure rules: tests/unit/test_entries.py):
1 never early   - every recorded send (``Rig.sends``) and drained message;
                  test_a_run_started_early_waits_for_the_due_instant,
                  test_never_early_whatever_the_host_clock_says, test_a_host_clock_*
2 never lost    - test_a_kill_at_any_step_*, test_interleaved_runs_*, test_a_run_out_of_time_*,
                  test_a_live_claim_of_another_run_defers_*, test_misfire_*,
                  test_a_recurring_timer_behind_catches_up_in_one_run, test_a_lost_card_*,
                  test_two_thousand_timers_*
3 one per fire  - the same (exactly one duplicate, only after a kill between send and record),
                  test_a_second_run_during_the_first_sends_each_fire_once, test_fifo_targets_*
4 changes win   - test_a_change_after_the_lease_before_the_claim_wins,
                  test_a_change_after_the_claim_lets_that_fire_go_and_stops_the_rest,
                  test_a_stale_card_never_claims
5 tenants apart - test_due_timers_fire_once_on_time_with_the_contract_body (own queues)
6 target fails  - test_a_deleted_queue_*, test_throttling_*, test_access_denied_*,
                  test_a_slow_queue_does_not_hold_up_another
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import botocore.client
import pytest
import redis
from botocore.exceptions import ClientError, EndpointConnectionError, ReadTimeoutError

from functions.trigger import app as trigger_app
from ops.local.context import LambdaContext
from tests.integration.api_harness import SETTINGS, Api, make_api
from tests.support.callbacks import drain
from tests.support.clock import T0, FakeClock
from timers.core.clock import MAX_CLOCK_OFFSET_MS
from timers.core.times import format_ms, parse_ms
from timers.core.window import send_at
from timers.engine import keys
from timers.engine.callbacks import SEND_ATTEMPTS
from timers.engine.changes import OWED_WAIT_MS
from timers.engine.claim import CLAIM_ATTEMPTS, CLAIM_RETRY_MS
from timers.engine.entries import (
    CHECKPOINT_EVERY,
    LAPSE_MARGIN_MS,
    MISFIRE_GRACE_MS,
    Entry,
    entry_ref,
)
from timers.engine.index import BucketIndex, Card
from timers.engine.log import FireLog
from timers.engine.migrate import MigrationReport, run_migrator
from timers.engine.send import drain_usage
from timers.engine.trigger import (
    ARM_MS,
    FIRST_LEASE,
    HOOKS,
    LEASE_GRACE_MS,
    SEND_GUARD_MS,
    Pace,
    RunMarker,
    TriggerDeps,
    TriggerReport,
    run_trigger,
)
from timers.runtime import DAY_MS, migrator_deps, trigger_deps
from timers.store.timers_table import PAYLOAD_SUFFIX
from timers.tenancy.auth import AUTH_CACHE_MS

pytestmark = pytest.mark.integration

EVENTS = Path(__file__).resolve().parents[2] / "events"
REMAINING_MS = 30_000  # the template's Timeout: what get_remaining_time_in_millis starts at
LAPSE_MS = REMAINING_MS + LEASE_GRACE_MS + 1  # after this a killed run's leases and claims lapsed


class Kill(BaseException):
    """The run dies here (Lambda timeout, OOM, host loss): nothing of it runs on - no hand-back.
    A BaseException, so the trigger's own ``except Exception`` clean-up does not see it."""


def kill_at(step: str) -> Callable[[str], None]:
    def hook(current: str) -> None:
        if current == step:
            raise Kill(step)

    return hook


@dataclass
class Sent:
    fire_id: str
    scheduled: int
    at: int  # the reference time of the send: what SentTimestamp would show


class RecordingSqs:
    """moto's SQS, recording each message with the reference time it was sent at."""

    def __init__(self, real: Any, clock: FakeClock, delay_ms: int = 0) -> None:
        self.real, self.clock, self.delay_ms = real, clock, delay_ms
        self.sent: list[Sent] = []
        self._lock = threading.Lock()

    def send_message_batch(self, *, QueueUrl: str, Entries: Sequence[Any]) -> Any:
        with self._lock:
            at = self.clock()
            for e in Entries:
                body = json.loads(e["MessageBody"])
                self.sent.append(Sent(body["fire_id"], parse_ms(body["scheduled_at"]), at))
            self.clock.advance(self.delay_ms)  # a slow SQS: the call takes this long
        return self.real.send_message_batch(QueueUrl=QueueUrl, Entries=Entries)


@dataclass
class Rig:
    api: Api
    clock: FakeClock
    sqs: RecordingSqs = field(init=False)
    host_offset_ms: int = 0  # how wrong the trigger host's clock is

    def __post_init__(self) -> None:
        self.sqs = RecordingSqs(boto3.client("sqs"), self.clock)

    @property
    def index(self) -> BucketIndex:
        return self.api.runtime.wiring.index

    @property
    def log(self) -> FireLog:
        return self.api.runtime.wiring.log

    def sleep(self, seconds: float) -> None:
        self.clock.advance(max(1, math.ceil(seconds * 1000)))

    def deps(self, **overrides: Any) -> TriggerDeps:
        return trigger_deps(
            self.api.runtime.wiring,
            **{
                "sqs": self.sqs,
                "clock": lambda: self.clock() + self.host_offset_ms,
                "monotonic": lambda: self.clock() - T0 + 12_345,  # elapsed time, own origin
                "reference": self.clock,
                "sleep": self.sleep,
                **overrides,
            },
        )

    def migrate(self) -> MigrationReport:
        return run_migrator(migrator_deps(self.api.runtime.wiring, sleep=self.sleep), self.clock())

    def run(self, remaining_ms: int = REMAINING_MS, **overrides: Any) -> list[TriggerReport]:
        """One run for every bucket with something leasable, as the fan-out would start."""
        now = self.clock()
        peeks = self.index.peek(range(self.index.bucket_count), now + ARM_MS)
        try:
            return [
                run_trigger(self.deps(**overrides), bucket, remaining_ms)
                for bucket, peek in sorted(peeks.items())
                if not isinstance(peek, Exception) and peek.backlog
            ]
        finally:
            drain_usage()  # a killed run's usage writes too: what the test reads next is whole

    def due_buckets(self) -> list[int]:
        """The buckets with something leasable now, as the fan-out would start them."""
        peeks = self.index.peek(range(self.index.bucket_count), self.clock() + ARM_MS)
        return sorted(b for b, p in peeks.items() if not isinstance(p, Exception) and p.backlog)

    def run_until_idle(self, **overrides: Any) -> list[TriggerReport]:
        reports: list[TriggerReport] = []
        for _ in range(200):
            ran = self.run(**overrides)
            if not ran:
                return reports
            reports += ran
        raise AssertionError("the trigger never ran out of work")

    def per_fire(self) -> Counter[str]:
        return Counter(s.fire_id for s in self.sqs.sent)

    def drain(self, queue_url: str) -> list[dict[str, Any]]:
        return drain(self.sqs.real, queue_url, self.clock())

    def fires(self, timer_id: str, tenant: str = "acme") -> list[dict[str, Any]]:
        reply = self.api.call("GET", f"/v1/timers/{timer_id}/fires", tenant=tenant)
        assert reply.status == 200, reply.body
        return list(reply.body["items"])

    def usage(self, tenant: str = "acme") -> dict[str, Any]:
        """The tenant's usage of this month, as GET /v1/tenant/usage answers it."""
        reply = self.api.call("GET", "/v1/tenant/usage", tenant=tenant)
        assert reply.status == 200, reply.body
        return dict(reply.body)

    def timer(self, timer_id: str, tenant: str = "acme") -> dict[str, Any]:
        return dict(self.api.call("GET", f"/v1/timers/{timer_id}", tenant=tenant).body)

    def stored(self, timer_id: str, tenant: str = "acme") -> Any:
        return self.api.runtime.wiring.timers.get(tenant, timer_id)

    @property
    def stored_store(self) -> Any:
        return self.api.runtime.wiring.timers

    def stored_item_expiry(self, timer_id: str, tenant: str = "acme") -> Any:
        return self.stored_store.models.timer.get(tenant, timer_id).expires_at

    def cards(self) -> dict[str, tuple[int, Card]]:
        """Every card in Redis (member -> its score and card), due or leased."""
        out: dict[str, tuple[int, Card]] = {}
        for bucket in range(self.index.bucket_count):
            out |= self.index.cards(bucket)
        return out

    def positions(self) -> set[tuple[str, int]]:
        """(timer id, position) of every card in Redis."""
        return {(card.timer.id, card.pos) for _, card in self.cards().values()}


def rig_with(api: Api, clock: FakeClock) -> Iterator[Rig]:
    """After the test, invariant 1 is checked on every send the rig recorded (the reference
    time of the send, not its claim)."""
    rig = Rig(api, clock)
    yield rig
    early = [s for s in rig.sqs.sent if s.at < s.scheduled]
    assert not early, f"sent early: {early}"


@pytest.fixture
def rig(
    aws: None, clock: FakeClock, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Rig]:
    """Every timer in one bucket, so a test's timers share runs and claim items."""
    yield from rig_with(make_api(monkeypatch, clock, redis_url, bucket_count=1), clock)


@pytest.fixture
def spread_rig(
    aws: None, clock: FakeClock, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Rig]:
    """The deployment's bucket count: timers spread over buckets, one run per due bucket."""
    yield from rig_with(make_api(monkeypatch, clock, redis_url), clock)


def after(seconds: float) -> dict[str, Any]:
    return {"type": "after", "seconds": seconds}


def until_armed(rig: Rig, due_ms: int) -> None:
    """Move the clock to just inside the run's arming window for ``due_ms``."""
    rig.clock.now = due_ms - ARM_MS + 10


# ---------------------------------------------------------------- on time, once


def test_due_timers_fire_once_on_time_with_the_contract_body(spread_rig: Rig) -> None:
    rig, api = spread_rig, spread_rig.api
    payload = {"order": 42, "note": "grüße", "nested": [1.5, None, True]}
    one = api.create(schedule=after(2), payload=payload, name="reminder")
    every = api.create(schedule={"type": "every", "seconds": 1})
    theirs = api.create("globex", schedule=after(2), payload="x")

    until_armed(rig, T0 + 1_000)
    (first,) = rig.run()  # the run waits for 10:00:01 and sends
    assert (first.enqueued, rig.clock() >= T0 + 1_000) == (1, True)
    _, chained = rig.cards()[f"acme|{every['id']}"]
    assert (chained.pos, chained.n, chained.pv) == (T0 + 2_000, 1, T0 + 1_000)
    until_armed(rig, T0 + 2_000)
    reports = rig.run()
    assert sum(r.enqueued for r in reports) == 3
    assert rig.run() == []  # nothing left: each fire went out once
    assert set(rig.per_fire().values()) == {1}
    # on time: the guard and the clock's 1 ms resolution, nothing more
    assert all(0 <= s.at - s.scheduled <= SEND_GUARD_MS + 2 for s in rig.sqs.sent)

    acme = {(m["timer_id"], m["scheduled_at"]): m for m in rig.drain(api.queues["acme"])}
    assert set(acme) == {
        (every["id"], format_ms(T0 + 1_000)),
        (every["id"], format_ms(T0 + 2_000)),
        (one["id"], format_ms(T0 + 2_000)),
    }
    body = acme[(one["id"], format_ms(T0 + 2_000))]
    del body["_attributes"]
    fired_at = body.pop("fired_at")
    assert 0 <= parse_ms(fired_at) - (T0 + 2_000) <= SEND_GUARD_MS + 2
    assert body == {
        "fire_id": f"{one['id']}:{T0 + 2_000}",
        "timer_id": one["id"],
        "tenant": "acme",
        "name": "reminder",
        "scheduled_at": "2026-11-21T10:00:02.000Z",
        "payload": payload,
    }
    assert [m["timer_id"] for m in rig.drain(api.queues["globex"])] == [theirs["id"]]

    shown = rig.timer(one["id"])
    assert (shown["status"], shown["fire_count"], shown["next_fire_at"]) == ("completed", 1, None)
    assert shown["expires_at"] == format_ms(T0 + 2_000 + SETTINGS.fire_retention_days * DAY_MS)
    (fire,) = rig.fires(one["id"])
    assert fire["fire_id"] == f"{one['id']}:{T0 + 2_000}"
    assert (fire["status"], fire["reason"]) == ("enqueued", None)
    assert 0 <= fire["lag_ms"] <= SEND_GUARD_MS + 2
    recurring = rig.timer(every["id"])
    assert (recurring["status"], recurring["fire_count"]) == ("active", 2)
    assert recurring["next_fire_at"] == format_ms(T0 + 3_000)
    assert [f["scheduled_at"] for f in rig.fires(every["id"])] == [
        format_ms(T0 + 2_000),
        format_ms(T0 + 1_000),
    ]


def test_a_run_started_early_waits_for_the_due_instant(rig: Rig) -> None:
    rig.api.create(schedule=after(5))
    rig.clock.now = T0 + 5_000 - ARM_MS - 1  # just outside the arming window
    assert rig.run() == []
    rig.clock.now = T0 + 5_000 - 200
    (report,) = rig.run()
    (sent,) = rig.sqs.sent
    assert report.enqueued == 1
    assert T0 + 5_000 <= sent.at <= T0 + 5_000 + SEND_GUARD_MS + 2  # it slept until then


def test_a_one_shot_fire_writes_nothing_to_its_timer(rig: Rig) -> None:
    created = rig.api.create(schedule=after(1))
    before = rig.stored(created["id"])
    until_armed(rig, T0 + 1_000)
    rig.run()
    assert rig.stored(created["id"]) == before  # derived, not rewritten: no write per fire
    assert rig.timer(created["id"])["status"] == "completed"


# ---------------------------------------------------------------- never early, any host clock


@pytest.mark.parametrize("offset_ms", [-1_500, -300, -20, 0, 20, 300, 1_500])
def test_never_early_whatever_the_host_clock_says(rig: Rig, offset_ms: int) -> None:
    """The host thinks it is ``offset_ms`` later than it is: the run corrects by Redis TIME."""
    rig.host_offset_ms = offset_ms
    timer = rig.api.create(schedule=after(5))
    until_armed(rig, T0 + 5_000)
    (report,) = rig.run()
    (sent,) = rig.sqs.sent
    assert report.enqueued == 1
    assert T0 + 5_000 <= sent.at <= T0 + 5_000 + SEND_GUARD_MS + 2
    (message,) = rig.drain(rig.api.queues["acme"])
    assert message["scheduled_at"] <= message["fired_at"]
    assert rig.fires(timer["id"])[0]["lag_ms"] >= 0


@pytest.mark.parametrize("offset_ms", [MAX_CLOCK_OFFSET_MS + 1, -MAX_CLOCK_OFFSET_MS - 500])
def test_a_host_clock_too_far_off_sends_nothing(rig: Rig, offset_ms: int) -> None:
    timer = rig.api.create(schedule=after(1))
    rig.host_offset_ms = offset_ms
    rig.clock.now = T0 + 2_000
    (report,) = rig.run()
    assert (report.refused, report.leased, rig.sqs.sent) == (1, 0, [])
    assert rig.positions() == {(timer["id"], T0 + 1_000)}  # still there for a sane host
    rig.host_offset_ms = 0
    (report,) = rig.run()
    assert report.enqueued == 1


def test_a_host_clock_read_over_a_slow_round_trip_is_not_trusted(rig: Rig) -> None:
    rig.api.create(schedule=after(1))
    rig.clock.now = T0 + 2_000

    def slow_reference() -> int:  # the TIME answer arrived 400 ms after it was asked
        rig.clock.advance(400)
        return rig.clock() - 200

    (report,) = rig.run(reference=slow_reference)
    assert (report.refused, rig.sqs.sent) == (1, [])


def test_without_a_reference_clock_nothing_is_sent(rig: Rig) -> None:
    rig.api.create(schedule=after(1))
    rig.clock.now = T0 + 2_000

    def down() -> int:
        raise ConnectionError("redis is gone")

    with pytest.raises(ConnectionError):
        rig.run(reference=down)
    assert rig.sqs.sent == []


# ---------------------------------------------------------------- kills and takeovers


@pytest.mark.parametrize("step", HOOKS)
def test_a_kill_at_any_step_is_finished_by_the_next_run(rig: Rig, step: str) -> None:
    one = rig.api.create(schedule=after(1), payload={"n": 1})
    every = rig.api.create(schedule={"type": "every", "seconds": 60}, payload={"n": 2})
    rig.clock.now = T0 + 60_010  # both due: they go out in one batch
    with pytest.raises(Kill):
        rig.run(hooks=kill_at(step))
    sent_before = len(rig.sqs.sent)
    assert sent_before == (0 if HOOKS.index(step) < HOOKS.index("sent") else 2)

    # Until the dead run's leases lapse its members are nobody else's to fire.
    assert sum(r.leased for r in rig.run()) == 0
    rig.clock.advance(LAPSE_MS)
    rig.run_until_idle()
    per_fire = rig.per_fire()
    expected = {f"{one['id']}:{T0 + 1_000}", f"{every['id']}:{T0 + 60_000}"}
    assert set(per_fire) == expected  # never lost
    # one callback per fire, except the documented window: sent, then died before recording
    assert set(per_fire.values()) == {2 if step == "sent" else 1}
    assert [f["status"] for f in rig.fires(one["id"])] == ["enqueued"]
    assert rig.timer(one["id"])["status"] == "completed"
    recurring = rig.timer(every["id"])
    assert (recurring["fire_count"], recurring["next_fire_at"]) == (1, format_ms(T0 + 120_000))
    assert (every["id"], T0 + 120_000) in rig.positions()


@pytest.mark.parametrize(("first", "second"), list(itertools.product(HOOKS, HOOKS)))
def test_interleaved_runs_crashing_at_every_step_send_each_fire_once_but_after_a_send(
    rig: Rig, first: str, second: str
) -> None:
    """Three runs: the first killed at one step, the second (a takeover) at another, the third
    finishes. A fire is sent again only by a takeover of a run killed after sending it."""
    timers = [rig.api.create(schedule=after(1), payload={"n": n}) for n in range(3)]
    rig.clock.now = T0 + 1_000
    with pytest.raises(Kill):
        rig.run(hooks=kill_at(first))
    rig.clock.advance(LAPSE_MS)
    second_sends = HOOKS.index(first) < HOOKS.index("recorded")  # it has to send again
    try:
        rig.run(hooks=kill_at(second))
        assert not second_sends or HOOKS.index(second) > HOOKS.index("finished")
    except Kill:
        pass
    rig.clock.advance(LAPSE_MS)
    rig.run_until_idle()

    copies = 1 + (first == "sent") + (second == "sent" and second_sends)
    assert rig.per_fire() == Counter({f"{t['id']}:{T0 + 1_000}": copies for t in timers})
    assert {rig.timer(t["id"])["status"] for t in timers} == {"completed"}
    assert rig.positions() == set()


@pytest.mark.parametrize("step", HOOKS)
def test_a_second_run_during_the_first_sends_each_fire_once(rig: Rig, step: str) -> None:
    """A duplicate invocation: a whole second run happens while the first is at ``step``."""
    timers = [rig.api.create(schedule=after(1)) for _ in range(5)]
    rig.clock.now = T0 + 1_000
    nested: list[TriggerReport] = []

    def hook(current: str) -> None:
        if current == step and not nested:
            nested.append(run_trigger(rig.deps(), 0, REMAINING_MS))

    rig.run(hooks=hook)
    rig.run_until_idle()
    assert rig.per_fire() == Counter({f"{t['id']}:{T0 + 1_000}": 1 for t in timers})


def test_a_live_claim_of_another_run_defers_the_member_until_it_lapses(rig: Rig) -> None:
    timer = rig.api.create(schedule=after(1))
    key, name = entry_ref(rig.stored(timer["id"]).partition, timer["id"], T0 + 1_000)
    until = T0 + 10_000
    theirs = Entry("p", 1, n=1, owner="other-run", until=until)
    assert rig.log.claim(key, {name: theirs})
    rig.clock.now = T0 + 1_000
    (report,) = rig.run()
    assert (report.held, report.enqueued, rig.sqs.sent) == (1, 0, [])
    assert rig.run() == []  # deferred, not dropped, and not busy-looping
    rig.clock.now = until + LAPSE_MARGIN_MS + 1  # the other run died: its claim lapsed
    (report,) = rig.run()
    assert report.enqueued == 1
    assert rig.per_fire() == Counter({f"{timer['id']}:{T0 + 1_000}": 1})


def test_live_claims_lapsing_within_the_arming_window_are_waited_for_not_leased_round_and_round(
    rig: Rig,
) -> None:
    """Another run claimed a backlog of 150 fires (more than a lease) and died; its claims
    lapse 100 ms after this run starts, inside ARM_MS. A member deferred to its claim's lapse
    was leasable again at once, so the run leased, read and deferred the backlog round and
    round until the claims lapsed (on AWS a loop of consistent reads for up to ARM_MS; on an
    injected clock, where a call takes no time, for ever: the stateful test's Runaway).
    Deferred past the lapse, they wait for it; the next run takes them over and sends each
    once, after the lapse."""
    created = create_many(rig, "acme", 150, [T0 + 1_000])
    until = T0 + 10_000
    for timer in created:
        key, name = entry_ref(rig.stored(timer["id"]).partition, timer["id"], T0 + 1_000)
        assert rig.log.claim(key, {name: Entry("p", 1, n=1, owner="other-run", until=until)})
    lapse = until + LAPSE_MARGIN_MS
    rig.clock.now = lapse - 100
    leases = 0
    lease = rig.index.lease

    def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal leases
        leases += 1
        if leases > 50:
            raise AssertionError("leased round and round while the claims were live")
        return lease(*args, **kwargs)

    rig.index.lease = counted  # type: ignore[method-assign]
    (report,) = rig.run()
    assert (report.held, report.enqueued, leases) == (150, 0, 3)  # FIRST_LEASE, 100, the rest
    assert rig.run() == []  # nothing leasable before the lapse
    rig.clock.now = lapse + 1
    (report,) = rig.run()
    assert (report.taken_over, report.enqueued) == (150, 150)
    assert all(sent.at > lapse for sent in rig.sqs.sent)
    assert set(rig.per_fire().values()) == {1} and len(rig.per_fire()) == 150


# ---------------------------------------------------------------- the deadline


@pytest.mark.parametrize(
    ("sqs_ms", "claim_ms", "remaining_ms"),
    [(1_500, 500, 20_000), (3_900, 0, 25_000), (200, 2_000, 18_000), (2_500, 1_500, 30_000)],
)
def test_a_run_out_of_time_never_duplicates_nor_loses(
    rig: Rig, sqs_ms: int, claim_ms: int, remaining_ms: int
) -> None:
    """Slow SQS and DynamoDB, and a run the platform kills at its deadline: whatever the run
    had started, the next runs finish it - 0 duplicates, 0 lost."""
    queues = [rig.api.queues["acme"], rig.api.queues["globex"]]
    created = [
        timer
        for tenant in ("acme", "globex")
        for timer in create_many(rig, tenant, 120, [T0 + 1_000, T0 + 1_100, T0 + 1_200])
    ]
    rig.sqs.delay_ms = sqs_ms
    slow = SlowLog(rig.log, rig.clock, claim_ms)
    rig.clock.now = T0 + 1_000
    end = rig.clock() + remaining_ms

    def clock_of_a_run_that_is_killed_at_its_end() -> int:  # read at every step of the run
        if rig.clock() > end:
            raise Kill("the platform ends the invocation")
        return rig.clock()

    with contextlib.suppress(Kill):
        rig.run(
            remaining_ms,
            log=slow,
            clock=clock_of_a_run_that_is_killed_at_its_end,
            reference=clock_of_a_run_that_is_killed_at_its_end,
        )
    rig.sqs.delay_ms = 0
    rig.clock.advance(LAPSE_MS)
    rig.run_until_idle()
    expected = {f"{t['id']}:{parse_ms(t['next_fire_at'])}" for t in created}
    per_fire = rig.per_fire()
    assert set(per_fire) == expected
    assert set(per_fire.values()) == {1}
    for queue in queues:
        rig.drain(queue)


class SlowLog(FireLog):
    """The fire log, each write taking ``delay_ms`` of the injected clock."""

    def __init__(self, real: FireLog, clock: FakeClock, delay_ms: int) -> None:
        super().__init__(real.table, real.retention_days, real.client)
        self.clock, self.delay_ms = clock, delay_ms

    def _write(self, *args: Any, **kwargs: Any) -> bool:
        self.clock.advance(self.delay_ms)
        return super()._write(*args, **kwargs)


class FlakyLog(FireLog):
    """The fire log, whose next ``claim`` or ``record`` calls fail by script: a timeout after
    DynamoDB applied the write (``"applied"``) or before it reached it (``"lost"``)."""

    def __init__(self, real: FireLog, **script: list[str]) -> None:
        super().__init__(real.table, real.retention_days, real.client)
        self.script = script

    def _flaky(self, call: str, write: Callable[[], bool]) -> bool:
        how = self.script.get(call, []).pop(0) if self.script.get(call) else None
        if how == "lost":
            raise ReadTimeoutError(endpoint_url="http://dynamodb")
        result = write()
        if how == "applied":
            raise ReadTimeoutError(endpoint_url="http://dynamodb")
        return result

    def claim(self, key: str, entries: Any, seen: Any = None) -> bool:
        return self._flaky("claim", lambda: super(FlakyLog, self).claim(key, entries, seen))

    def record(self, key: str, owner: str, entries: Any, release: bool = False) -> bool:
        write = super().record
        return self._flaky("record", lambda: write(key, owner, entries, release))


@pytest.mark.parametrize("how", ["lost", "applied"])
def test_a_record_that_times_out_is_retried_so_the_fire_is_sent_once(rig: Rig, how: str) -> None:
    # A record given up after the send would leave the claim pending; once it lapsed, the
    # next run would send the fire again.
    timer = rig.api.create(schedule=after(1))
    rig.clock.now = T0 + 1_000
    (report,) = rig.run(log=FlakyLog(rig.log, record=[how, how]))
    assert report.enqueued == 1
    rig.clock.advance(LAPSE_MS)
    rig.run_until_idle()
    assert rig.per_fire() == Counter({f"{timer['id']}:{T0 + 1_000}": 1})
    assert [f["status"] for f in rig.fires(timer["id"])] == ["enqueued"]


@pytest.mark.parametrize("how", ["lost", "applied"])
def test_a_claim_that_times_out_once_is_retried_and_the_fire_sent_once(rig: Rig, how: str) -> None:
    # Retried with the same owner: a claim DynamoDB applied is found again as this run's.
    timer = rig.api.create(schedule=after(1))
    rig.clock.now = T0 + 1_000
    (report,) = rig.run(log=FlakyLog(rig.log, claim=[how]))
    assert (report.enqueued, report.handed_back, report.held) == (1, 0, 0)
    rig.clock.advance(LAPSE_MS)
    rig.run_until_idle()
    assert rig.per_fire() == Counter({f"{timer['id']}:{T0 + 1_000}": 1})


@pytest.mark.parametrize("how", ["lost", "applied"])
def test_a_claim_that_times_out_sends_nothing_and_gives_its_cards_back(rig: Rig, how: str) -> None:
    timer = rig.api.create(schedule=after(1))
    rig.clock.now = T0 + 1_000
    first, *_ = rig.run(log=FlakyLog(rig.log, claim=[how] * CLAIM_ATTEMPTS))
    assert first.handed_back >= 1 and rig.sqs.sent == [] and len(rig.positions()) == 1
    assert rig.run() == []  # a claim error is tried again a second later, not in a tight loop
    rig.clock.advance(CLAIM_RETRY_MS)
    if how == "applied":  # the entry is the dead run's until it lapses: late, not twice
        rig.clock.advance(LAPSE_MS)
    rig.run_until_idle()
    assert rig.per_fire() == Counter({f"{timer['id']}:{T0 + 1_000}": 1})


def test_a_run_without_time_for_a_whole_fire_leases_nothing(rig: Rig) -> None:
    rig.api.create(schedule=after(1))
    rig.clock.now = T0 + 1_000
    (report,) = rig.run(remaining_ms=6_000)  # less than a lease, claim, send, record, finish
    assert (report.leased, rig.sqs.sent) == (0, [])
    assert len(rig.positions()) == 1  # left for a run with time


def test_what_a_run_will_not_send_it_hands_back_at_once(rig: Rig) -> None:
    """Claimed for 10:00:10, but the run must stop before then: the claim is released (valid
    until 0, never removed: entries only move forward) and the card is due again at once - the
    next run takes the claim over without waiting for a lapse."""
    timer = rig.api.create(schedule=after(10))
    rig.clock.now = T0 + 10_000 - 200
    pos = T0 + 10_000
    stopped: list[str] = []

    def hook(step: str) -> None:  # after the claim, the clock jumps to near the deadline:
        if step == "claimed" and not stopped:  # time to release, none to send
            stopped.append(step)
            rig.clock.advance(REMAINING_MS - 6_000)

    (report,) = rig.run(hooks=hook)
    assert (report.enqueued, report.handed_back, rig.sqs.sent) == (0, 1, [])
    ref = entry_ref(rig.stored(timer["id"]).partition, timer["id"], pos)
    released = rig.log.read([ref], consistent=True)[ref]
    assert released is not None and (released.state, released.until) == ("p", 0)
    (report,) = rig.run()
    assert (report.enqueued, report.taken_over) == (1, 1)
    assert rig.per_fire() == {f"{timer['id']}:{pos}": 1}


class FailingOver:
    """The bucket index while its shard fails over: settles are refused, and so are the first
    ``refusals`` releases; then Redis answers again."""

    def __init__(self, real: BucketIndex, refusals: int) -> None:
        self.real, self.refusals = real, refusals

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def settle(self, *args: Any, **kwargs: Any) -> Any:
        raise redis.ConnectionError("Connection refused")

    def release(self, *args: Any, **kwargs: Any) -> Any:
        if self.refusals:
            self.refusals -= 1
            raise redis.ConnectionError("Connection refused")
        return self.real.release(*args, **kwargs)


def test_a_run_whose_redis_fails_over_hands_its_cards_back_once_it_answers(rig: Rig) -> None:
    """A failover mid-run (settle refused, then the hand-back refused for a second): the run
    keeps trying the hand-back while it has time, so the next run goes on at once instead of
    waiting ~33 s for the lease to end."""
    timer = rig.api.create(schedule={"type": "every", "seconds": 1})
    rig.clock.now = T0 + 1_000
    with pytest.raises(redis.ConnectionError):
        rig.run(index=FailingOver(rig.index, refusals=2))
    assert rig.per_fire() == Counter({f"{timer['id']}:{T0 + 1_000}": 1})
    rig.clock.now = max(rig.clock(), T0 + 2_000)
    rig.run()
    assert rig.per_fire()[f"{timer['id']}:{T0 + 2_000}"] == 1


# ---------------------------------------------------------------- changes win


def change(rig: Rig, timer_id: str, how: str) -> None:
    path = f"/v1/timers/{timer_id}"
    reply = {
        "delete": lambda: rig.api.call("DELETE", path),
        "pause": lambda: rig.api.call("POST", f"{path}/pause"),
        "payload": lambda: rig.api.call("PATCH", path, body={"payload": "new"}),
        "schedule": lambda: rig.api.call("PATCH", path, body={"schedule": after(30)}),
        "reset": lambda: rig.api.call("POST", f"{path}/reset"),
    }[how]()
    assert reply.status in (200, 204), reply.body


@pytest.mark.parametrize("how", ["delete", "pause", "payload", "schedule", "reset"])
def test_a_change_after_the_lease_before_the_claim_wins(rig: Rig, how: str) -> None:
    timer = rig.api.create(schedule=after(1), payload="old")
    rig.clock.now = T0 + 1_000
    changed: list[str] = []

    def hook(step: str) -> None:
        if step == "leased" and not changed:
            changed.append(step)
            change(rig, timer["id"], how)

    (report,) = rig.run(hooks=hook)
    assert report.stale == 1 and report.enqueued == (1 if how == "payload" else 0)
    rig.clock.advance(40_000)
    rig.run_until_idle()
    payloads = [m["payload"] for m in rig.drain(rig.api.queues["acme"])]
    expected = {"delete": [], "pause": [], "payload": ["new"], "schedule": ["old"]}
    assert payloads == {**expected, "reset": ["old"]}[how]
    if how == "schedule":  # the new schedule fired, the old occurrence never
        assert [s.scheduled for s in rig.sqs.sent] == [T0 + 1_000 + 30_000]
    if how == "reset":  # restarted at the reset: after 1 s from then, the old occurrence never
        assert [s.scheduled for s in rig.sqs.sent] == [T0 + 1_000 + 1_000]
        assert rig.timer(timer["id"])["fire_count"] == 1


@pytest.mark.parametrize("how", ["delete", "pause", "schedule"])
def test_a_change_after_the_claim_lets_that_fire_go_and_stops_the_rest(rig: Rig, how: str) -> None:
    timer = rig.api.create(schedule={"type": "every", "seconds": 1})
    rig.clock.now = T0 + 1_000
    changed: list[str] = []

    def hook(step: str) -> None:
        if step == "claimed" and not changed:
            changed.append(step)
            change(rig, timer["id"], how)  # its tombstone lands on 10:00:02, not the claimed

    rig.run(hooks=hook)
    for _ in range(5):
        rig.clock.advance(1_000)
        rig.run_until_idle()
    fired = sorted(s.scheduled for s in rig.sqs.sent)
    assert fired[0] == T0 + 1_000  # claimed before the change: it goes
    assert T0 + 2_000 not in fired  # the next one of the old revision never does
    assert set(rig.per_fire().values()) == {1}
    if how != "schedule":
        assert fired == [T0 + 1_000]


@pytest.mark.parametrize("change_how", ["name", "max_fires", "pause"])
@pytest.mark.parametrize("then", ["hands_back", "dies", "dies_and_redis_is_flushed"])
def test_a_fire_claimed_before_a_change_is_sent_and_counted_whatever_its_run_does(
    rig: Rig, change_how: str, then: str
) -> None:
    """Issue 16, defect 3: the change meets a claimed, unsent fire. It adopts the claim instead
    of counting the fire as sent: the fire still goes - once - when its run gives it back, dies,
    or dies and Redis loses its member - and GET counts exactly what was sent."""
    timer = rig.api.create(schedule={"type": "every", "seconds": 1}, max_fires=4)
    path = f"/v1/timers/{timer['id']}"
    until_armed(rig, T0 + 1_000)
    changed: list[str] = []

    def hook(step: str) -> None:
        if step != "claimed" or changed:
            return
        changed.append(step)
        reply = {
            "name": lambda: rig.api.call("PATCH", path, body={"name": "renamed"}),
            "max_fires": lambda: rig.api.call("PATCH", path, body={"max_fires": 3}),
            "pause": lambda: rig.api.call("POST", f"{path}/pause"),
        }[change_how]()
        assert reply.status == 200, reply.body
        if then == "hands_back":  # a slow call: too little time left to send, enough to give
            rig.clock.advance(REMAINING_MS - 10_000)  # it back (a read and a write: adopted)
        else:
            raise Kill(step)

    if then == "hands_back":
        rig.run(hooks=hook)
    else:
        with pytest.raises(Kill):
            rig.run(hooks=hook)
        rig.clock.advance(LAPSE_MS)  # the dead run's claim lapses
        if then == "dies_and_redis_is_flushed":
            rig.api.runtime.redis.flushall()
            rig.migrate()
    for _ in range(6):
        rig.run_until_idle()
        rig.clock.advance(1_000)
    sent = rig.per_fire()
    assert sent[f"{timer['id']}:{T0 + 1_000}"] == 1  # the owed fire, once
    shown = rig.timer(timer["id"])
    assert shown["fire_count"] == len(sent)
    assert {f["fire_id"] for f in rig.fires(timer["id"])} == set(sent)
    expected = {"name": 4, "max_fires": 3, "pause": 1}[change_how]
    assert len(sent) == expected  # and the new revision continued after it (or paused)
    assert max(sent.values()) == 1


def test_a_reset_waits_for_a_claimed_fire_so_nothing_of_the_old_schedule_comes_after_it(
    rig: Rig,
) -> None:
    """A reset is not a change that adopts a claimed fire: it waits until the run sent and
    recorded it, then restarts. So the fire was enqueued before the reset answered, and no
    occurrence of the old schedule is sent after it."""
    timer = rig.api.create(schedule={"type": "every", "seconds": 1})
    path = f"/v1/timers/{timer['id']}"
    until_armed(rig, T0 + 1_000)
    waiting, recorded = threading.Event(), threading.Event()

    def poll(_: float) -> None:  # the reset's wait between reads: here, for the run's record
        waiting.set()
        recorded.wait(timeout=10)

    rig.api.runtime.wiring.changes.sleep = poll
    answered: list[tuple[int, Any, int]] = []  # status, body, sends before the answer
    resetting: list[threading.Thread] = []

    def reset() -> None:
        reply = rig.api.call("POST", f"{path}/reset")
        answered.append((reply.status, reply.body, len(rig.sqs.sent)))

    def hook(step: str) -> None:
        if step == "claimed" and not resetting:
            resetting.append(threading.Thread(target=reset))
            resetting[0].start()
            assert waiting.wait(timeout=10)  # the reset read the claim and waits for it
        if step == "recorded" and resetting:
            recorded.set()
            resetting[0].join(timeout=10)  # the reset commits before the run goes on

    rig.run(hooks=hook)
    [(status, body, sends_before)] = answered
    assert status == 200, body
    assert sends_before == 1  # the claimed fire went out before the reset answered
    assert (body["fire_count"], body["status"]) == (0, "active")
    reset_at = parse_ms(body["updated_at"])
    assert parse_ms(body["next_fire_at"]) == reset_at + 1_000
    for _ in range(4):
        rig.clock.advance(1_000)
        rig.run_until_idle()
    sent = sorted(s.scheduled for s in rig.sqs.sent)
    assert sent[0] == T0 + 1_000
    assert sent[1:] == [reset_at + 1_000 * k for k in range(1, len(sent))]  # the new series
    assert max(rig.per_fire().values()) == 1
    assert rig.timer(timer["id"])["fire_count"] == len(sent) - 1
    assert {f["fire_id"] for f in rig.fires(timer["id"])} == set(rig.per_fire())


def test_a_reset_meeting_a_claim_its_run_does_not_finish_is_409_and_changes_nothing(
    rig: Rig,
) -> None:
    """The claimant is stuck (here: it is the hook's caller; on AWS a run that died holds its
    claim ~33 s): the reset gives up after OWED_WAIT_MS, changes nothing, and the fire goes."""
    timer = rig.api.create(schedule={"type": "every", "seconds": 1}, max_fires=1)
    path = f"/v1/timers/{timer['id']}"
    until_armed(rig, T0 + 1_000)
    replies: list[Any] = []

    def hook(step: str) -> None:
        if step == "claimed" and not replies:
            started = rig.clock()
            replies.append(rig.api.call("POST", f"{path}/reset"))
            assert rig.clock() - started >= OWED_WAIT_MS  # it waited, on the injected clock

    rig.run(hooks=hook)
    [refused] = replies
    assert (refused.status, refused.error_code) == (409, "invalid_state")
    rig.clock.advance(2_000)
    rig.run_until_idle()
    assert rig.per_fire() == Counter({f"{timer['id']}:{T0 + 1_000}": 1})  # late, not lost
    shown = rig.timer(timer["id"])
    assert (shown["status"], shown["fire_count"]) == ("completed", 1)
    assert shown["updated_at"] == timer["updated_at"]
    again = rig.api.call("POST", f"{path}/reset")  # with nothing in flight it goes through
    assert (again.status, again.body["status"], again.body["fire_count"]) == (200, "active", 0)


@pytest.mark.parametrize("flushed", [False, True])
def test_an_owed_fire_past_a_lowered_max_fires_still_counts_and_stays_findable(
    rig: Rig, flushed: bool
) -> None:
    """max_fires lowered to what had already fired while the next fire was claimed: the claim
    stands (the fire goes, the count ends above max_fires), through a later change and a run
    that dies before sending. The walk used to stop at max_fires before reading the owed
    entry: GET showed it unfired, the next change completed the timer, and after a flush no
    one put the fire back (found by a stateful soak, seed 505)."""
    timer = rig.api.create(schedule={"type": "every", "seconds": 1})
    path = f"/v1/timers/{timer['id']}"
    until_armed(rig, T0 + 1_000)
    rig.run_until_idle()  # 10:00:01 fired
    until_armed(rig, T0 + 2_000)
    replies: list[Any] = []

    def hook(step: str) -> None:
        if step == "claimed" and not replies:
            replies.append(rig.api.call("PATCH", path, body={"max_fires": 1}))
            replies.append(rig.api.call("PATCH", path, body={"name": "renamed"}))  # still owed
            raise Kill(step)

    with pytest.raises(Kill):
        rig.run(hooks=hook)
    lowered, renamed = (reply.body for reply in replies)
    assert (lowered["status"], lowered["fire_count"], renamed["status"]) == ("active", 1, "active")
    assert rig.timer(timer["id"])["next_fire_at"] == format_ms(T0 + 2_000)  # owed, not done
    rig.clock.advance(LAPSE_MS)
    if flushed:
        rig.api.runtime.redis.flushall()
        rig.migrate()
    for _ in range(4):
        rig.run_until_idle()
        rig.clock.advance(1_000)
    sent = rig.per_fire()
    assert sent == Counter({f"{timer['id']}:{T0 + 1_000}": 1, f"{timer['id']}:{T0 + 2_000}": 1})
    shown = rig.timer(timer["id"])
    assert (shown["fire_count"], shown["status"]) == (2, "completed")
    assert {f["fire_id"] for f in rig.fires(timer["id"])} == set(sent)


@pytest.mark.parametrize("how", ["pause", "delete"])
def test_a_stale_card_outliving_its_fence_never_fires_a_changed_timer(rig: Rig, how: str) -> None:
    """A change whose Redis update failed leaves the old card in Redis; the fence on the
    position stops it - until it expires with its fire-log item. After an outage longer than
    the retention the stale card must not be believed (found by a random stateful soak: a
    deleted timer fired half a year later)."""
    timer = rig.api.create(schedule={"type": "every", "seconds": 7}, misfire="skip")
    changes = rig.api.runtime.service.changes
    changes.index = None  # the change's Redis update fails (the api logs it and goes on)
    reply = (rig.api.call("POST", f"/v1/timers/{timer['id']}/pause") if how == "pause"
             else rig.api.call("DELETE", f"/v1/timers/{timer['id']}"))  # fmt: skip
    assert reply.status in (200, 204), reply.body
    changes.index = rig.index
    assert rig.positions()  # the old card is still there
    rig.clock.advance((SETTINGS.fire_retention_days + 2) * DAY_MS)  # nothing ran meanwhile
    dynamodb = boto3.client("dynamodb")
    for item in dynamodb.scan(TableName=SETTINGS.claims_table)["Items"]:  # TTL ran: fences gone
        if int(item.get("expires_at", {"N": "0"})["N"]) <= rig.clock() // 1000:
            dynamodb.delete_item(TableName=SETTINGS.claims_table, Key={"k": item["k"]})
    rig.run_until_idle()
    assert rig.sqs.sent == []
    assert rig.positions() == set()


def test_a_takeover_sends_what_the_claim_decided_not_what_it_would_decide_now(rig: Rig) -> None:
    """A dead run claimed 10:00:01 on time; when its claim is taken over a minute and a half
    later, the timer is far behind and fire_once would now fire the latest occurrence instead
    - but the claim stands: the takeover sends 10:00:01 (the stateful test found the takeover
    sending its own decision: another fire id, and a duplicate of a later one)."""
    timer = rig.api.create(schedule={"type": "every", "seconds": 1})  # fire_once
    until_armed(rig, T0 + 1_000)
    with pytest.raises(Kill):
        rig.run(hooks=kill_at("claimed"))
    rig.clock.now = T0 + 90_000
    rig.run_until_idle()
    sent = rig.per_fire()
    assert f"{timer['id']}:{T0 + 1_000}" in sent and max(sent.values()) == 1
    assert rig.timer(timer["id"])["fire_count"] == len(sent)


def test_a_card_restored_beside_a_live_run_sends_its_fire_once(rig: Rig) -> None:
    """A flush while a run holds a fire: the migrator puts the card back and a second run
    leases it while the first is still sending. The second meets the first's live claim and
    waits; it comes back to find the fire recorded, and only chains it."""
    timer = rig.api.create(schedule=after(1))
    until_armed(rig, T0 + 1_000)
    nested: list[list[TriggerReport]] = []

    def hook(step: str) -> None:
        if step == "claimed" and not nested:
            rig.api.runtime.redis.flushall()
            rig.migrate()
            nested.append(rig.run())

    rig.run(hooks=hook)
    assert [r.held for r in nested[0]] == [1]
    rig.clock.advance(LAPSE_MS)
    rig.run_until_idle()
    assert rig.per_fire() == Counter({f"{timer['id']}:{T0 + 1_000}": 1})
    assert rig.positions() == set()


def test_a_one_shot_paused_past_the_retention_fires_when_resumed(rig: Rig) -> None:
    """Its expiry is counted from its fire - now, when that is past - not from its old due time
    (which would hide it at once). Found by the stateful test."""
    timer = rig.api.create(schedule=after(1))
    rig.api.call("POST", f"/v1/timers/{timer['id']}/pause")
    rig.clock.advance((SETTINGS.fire_retention_days + 2) * DAY_MS)
    resumed = rig.api.call("POST", f"/v1/timers/{timer['id']}/resume")
    assert resumed.status == 200 and resumed.body["status"] == "active"
    rig.run_until_idle()
    assert len(rig.sqs.sent) == 1
    assert rig.timer(timer["id"])["status"] == "completed"


def test_more_fires_granted_while_the_last_is_on_its_way_continue_after_it(rig: Rig) -> None:
    """Issue 16, defect 4: max_fires 1 -> 3 while the first (and so far last) fire is claimed:
    the timer goes on after it, from it - not completed, not from now."""
    timer = rig.api.create(schedule={"type": "every", "seconds": 1}, max_fires=1)
    until_armed(rig, T0 + 1_000)
    changed: list[str] = []

    def hook(step: str) -> None:
        if step == "claimed" and not changed:
            changed.append(step)
            reply = rig.api.call("PATCH", f"/v1/timers/{timer['id']}", body={"max_fires": 3})
            assert reply.status == 200 and reply.body["status"] == "active", reply.body

    rig.run(hooks=hook)
    for _ in range(4):
        rig.clock.advance(1_000)
        rig.run_until_idle()
    assert sorted(s.scheduled for s in rig.sqs.sent) == [T0 + 1_000, T0 + 2_000, T0 + 3_000]
    shown = rig.timer(timer["id"])
    assert (shown["fire_count"], shown["status"]) == (3, "completed")


def test_a_timer_whose_payload_item_is_gone_is_never_sent_with_a_made_up_payload(
    rig: Rig,
) -> None:
    """Issue 16, defect 5: a missing payload item used to become ``null``. Batch creates now
    write payload items before their timers; if one is gone anyway, nothing is sent - and the
    other timers of its bucket are restored all the same."""
    timer = rig.api.create(schedule=after(1), payload={"big": "x" * 2_000})
    other = rig.api.create(schedule=after(1), payload="fine")
    rig.stored_store.models.payload("acme", timer["id"] + PAYLOAD_SUFFIX).delete()
    rig.api.runtime.redis.flushall()  # the card (with its payload) is gone from Redis too
    rig.clock.now = T0 + 1_000
    report = rig.migrate()
    assert report.outcomes.get("broken") == 1 and report.failed_buckets == 0
    rig.run_until_idle()
    assert rig.per_fire() == Counter({f"{other['id']}:{T0 + 1_000}": 1})


def test_a_stale_card_never_claims(rig: Rig) -> None:
    """A change whose Redis update failed leaves the old revision's card: it meets the
    change's fence and claims nothing (R2, R5); the new revision comes back from its wake
    listing and fires with the new payload."""
    timer = rig.api.create(schedule=after(30), payload="old")
    changes = rig.api.runtime.service.changes
    changes.index = None  # the PATCH's Redis update fails (the api logs it and goes on)
    reply = rig.api.call("PATCH", f"/v1/timers/{timer['id']}", body={"payload": "new"})
    assert reply.status == 200, reply.body
    changes.index = rig.index
    (_, card), *_ = rig.cards().values()
    assert (card.timer.rev, card.timer.payload_json) == (1, '"old"')
    rig.clock.now = T0 + 30_000
    (report,) = rig.run()
    assert (report.stale, report.enqueued, rig.sqs.sent) == (1, 0, [])
    rig.migrate()  # the listing of revision 2 brings its card
    rig.run_until_idle()
    assert [m["payload"] for m in rig.drain(rig.api.queues["acme"])] == ["new"]


def test_a_lost_card_is_restored_from_its_listing(rig: Rig) -> None:
    """A member whose card is gone is dropped at its lease; the migrator's next look at the
    bucket finds no card for the listing and puts it back."""
    rig.api.create(schedule=after(1), payload={"big": "x" * 2_000})  # its own payload item
    rig.api.runtime.redis.delete(keys.data(0))
    rig.clock.now = T0 + 1_000
    assert [r.leased for r in rig.run()] == [0]
    rig.migrate()
    (report,) = rig.run()
    assert report.enqueued == 1
    assert rig.drain(rig.api.queues["acme"])[0]["payload"] == {"big": "x" * 2_000}


# ---------------------------------------------------------------- recurring


@pytest.mark.parametrize(
    ("misfire", "fired_minutes"),
    [("fire_all", list(range(1, 11))), ("fire_once", [10]), ("skip", [])],
)
def test_misfire_after_an_outage(rig: Rig, misfire: str, fired_minutes: list[int]) -> None:
    timer = rig.api.create(schedule={"type": "every", "seconds": 60}, misfire=misfire)
    # Down for ten minutes: occurrences at minutes 1..10 were missed, the latest 50 s ago.
    rig.clock.now = T0 + 10 * 60_000 + 50_000
    reports = rig.run()
    assert len(reports) == 1  # one run catches up however far behind
    assert [s.scheduled for s in rig.sqs.sent] == [T0 + k * 60_000 for k in fired_minutes]
    assert rig.timer(timer["id"])["next_fire_at"] == format_ms(T0 + 11 * 60_000)
    assert rig.timer(timer["id"])["fire_count"] == len(fired_minutes)
    if misfire != "fire_all":  # the chain jumped: the checkpoint moved there
        assert rig.stored(timer["id"]).next_fire_ms == T0 + 11 * 60_000

    rig.clock.now = T0 + 11 * 60_000  # ... then on schedule again
    rig.run_until_idle()
    assert rig.sqs.sent[-1].scheduled == T0 + 11 * 60_000


def test_the_checkpoint_moves_every_so_many_fires_and_not_in_between(rig: Rig) -> None:
    timer = rig.api.create(schedule={"type": "every", "seconds": 1})
    first = rig.stored(timer["id"])
    for k in range(1, CHECKPOINT_EVERY + 2):
        until_armed(rig, T0 + k * 1_000)
        rig.run()
        stored = rig.stored(timer["id"])
        if k < CHECKPOINT_EVERY:
            assert stored == first
    assert (stored.next_fire_ms, stored.fire_count) == (
        T0 + (CHECKPOINT_EVERY + 1) * 1_000,
        CHECKPOINT_EVERY,
    )
    assert stored.rev == first.rev  # a checkpoint is not a change
    shown = rig.timer(timer["id"])
    assert shown["fire_count"] == CHECKPOINT_EVERY + 1
    assert len(rig.per_fire()) == CHECKPOINT_EVERY + 1


@pytest.mark.parametrize(("schedule", "held"), [
    ({"type": "cron", "expression": "0 * * * *"}, True),  # hourly: stays chained in Redis
    ({"type": "every", "seconds": 2 * 3_600}, False),  # beyond HOLD_MS: leaves Redis
])  # fmt: skip
def test_an_hourly_chain_stays_in_redis_with_no_checkpoint_and_no_restore(
    rig: Rig, schedule: dict[str, Any], held: bool
) -> None:
    """Issue 17: a timer whose period exceeds the look-ahead but not HOLD_MS is chained in
    Redis from fire to fire - its stored item is not written and the migrator restores
    nothing; a longer period leaves Redis and moves its checkpoint (and is restored later)."""
    timer = rig.api.create(schedule=schedule)
    period = 3_600_000 if held else 7_200_000
    first_due = parse_ms(timer["next_fire_at"])
    rig.clock.now = first_due - SETTINGS.lookahead_seconds * 1000
    rig.migrate()
    for k in range(3):
        due = first_due + k * period
        until_armed(rig, due)
        assert rig.migrate().added == (0 if held or k == 0 else 1)
        before = rig.stored(timer["id"])
        rig.run_until_idle()
        assert (rig.stored(timer["id"]) == before) == held  # no checkpoint written
        assert [pos for _, pos in rig.positions()] == ([due + period] if held else [])
    assert len(rig.per_fire()) == 3 and max(rig.per_fire().values()) == 1
    assert rig.timer(timer["id"])["fire_count"] == 3


def test_a_recurring_timer_completes_once_with_its_retention(rig: Rig) -> None:
    timer = rig.api.create(schedule={"type": "every", "seconds": 1}, max_fires=2)
    for k in (1, 2):
        until_armed(rig, T0 + k * 1_000)
        rig.run()
    stored = rig.stored(timer["id"])
    assert (stored.status, stored.fire_count) == ("completed", 2)
    assert stored.expires_ms is not None and stored.expires_ms > rig.clock()
    assert rig.timer(timer["id"])["status"] == "completed"
    assert rig.positions() == set()


def test_a_big_payload_expires_with_its_completed_timer_and_never_under_a_rearmed_one(
    rig: Rig,
) -> None:
    """Completion sets the timer's and its payload item's expiry in one transaction, at the
    revision it completes: a change that re-armed the timer meanwhile keeps its payload."""
    big = {"big": "x" * 2_000}  # its own payload item
    timer = rig.api.create(schedule={"type": "every", "seconds": 1}, max_fires=1, payload=big)
    store = rig.stored_store
    before = rig.stored(timer["id"])
    rig.api.call("PATCH", f"/v1/timers/{timer['id']}", body={"max_fires": 5})  # re-armed
    assert not store.complete(before, 1, T0 + 1_000, rig.clock() + 60_000)  # a stale revision
    payload = store.models.payload.get("acme", timer["id"] + PAYLOAD_SUFFIX)
    assert payload.expires_at is None
    current = rig.stored(timer["id"])
    assert store.complete(current, 1, T0 + 1_000, rig.clock() + 60_000)
    expiry = store.models.payload.get("acme", timer["id"] + PAYLOAD_SUFFIX).expires_at
    assert expiry == rig.stored_item_expiry(timer["id"])


# ---------------------------------------------------------------- targets


def test_a_deleted_queue_fails_its_fire_without_holding_up_another_tenant(rig: Rig) -> None:
    doomed = rig.api.create(schedule=after(1))
    fine = rig.api.create("globex", schedule=after(1))
    rig.sqs.real.delete_queue(QueueUrl=rig.api.queues["acme"])
    rig.clock.now = T0 + 1_000
    (report,) = rig.run()
    assert (report.leased, report.enqueued, report.failed) == (2, 1, 1)

    (fire,) = rig.fires(doomed["id"])
    assert fire["status"] == "failed"
    assert "NonExistentQueue" in fire["reason"] or "QueueDoesNotExist" in fire["reason"]
    assert fire["enqueued_at"] is None
    assert rig.timer(doomed["id"])["status"] == "completed"  # used up all the same
    assert [m["timer_id"] for m in rig.drain(rig.api.queues["globex"])] == [fine["id"]]
    assert rig.run_until_idle() == []  # recorded, not retried forever


def test_fifo_targets_get_dedup_and_group_ids(rig: Rig) -> None:
    url = rig.sqs.real.create_queue(
        QueueName="timers-tenant-acme-orders.fifo", Attributes={"FifoQueue": "true"}
    )["QueueUrl"]
    rig.api.tenants.allow_queue("acme", url)
    rig.clock.advance(AUTH_CACHE_MS)
    timer = rig.api.create(schedule={"type": "every", "seconds": 1}, target={"queue_url": url})
    until_armed(rig, rig.clock() + 1_000)
    rig.run()
    (message,) = rig.drain(url)
    assert message["_attributes"]["MessageDeduplicationId"] == message["fire_id"]
    assert message["_attributes"]["MessageGroupId"] == timer["id"]


class ScriptedSqs:
    """The recording client behind a script of errors for one queue."""

    def __init__(self, rig: Rig, queue_url: str, script: Sequence[str | None]) -> None:
        self.rig, self.queue_url, self.script = rig, queue_url, list(script)
        self.calls = 0

    def send_message_batch(self, *, QueueUrl: str, Entries: Sequence[Any]) -> Any:
        if QueueUrl == self.queue_url:
            self.calls += 1
            code = self.script.pop(0) if self.script else None
            if code == "EntryFailure":  # the call succeeds, its entries fail on the server side
                failed = [
                    {"Id": e["Id"], "SenderFault": False, "Code": "InternalError", "Message": "x"}
                    for e in Entries
                ]
                return {"Successful": [], "Failed": failed}
            if code is not None:
                raise ClientError({"Error": {"Code": code, "Message": code}}, "SendMessageBatch")
        return self.rig.sqs.send_message_batch(QueueUrl=QueueUrl, Entries=Entries)


def test_throttling_is_retried_with_backoff_then_enqueued(rig: Rig) -> None:
    timer = rig.api.create(schedule=after(1))
    rig.clock.now = T0 + 1_000
    flaky = ScriptedSqs(rig, rig.api.queues["acme"], ["ThrottlingException", "EntryFailure"])
    (report,) = rig.run(sqs=flaky)
    assert (report.enqueued, flaky.calls) == (1, 3)
    assert [f["status"] for f in rig.fires(timer["id"])] == ["enqueued"]
    assert len(rig.drain(rig.api.queues["acme"])) == 1


@pytest.mark.parametrize(
    ("script", "calls", "reason"),
    [
        (["AccessDenied"], 1, "AccessDenied"),  # permanent: no retries
        (["ThrottlingException"] * SEND_ATTEMPTS, SEND_ATTEMPTS, "gave up after"),
    ],
)
def test_access_denied_and_exhausted_retries_record_the_fire_failed(
    rig: Rig, script: list[str], calls: int, reason: str
) -> None:
    timer = rig.api.create(schedule=after(1))
    rig.clock.now = T0 + 1_000
    scripted = ScriptedSqs(rig, rig.api.queues["acme"], script)
    (report,) = rig.run(sqs=scripted)
    assert (report.failed, scripted.calls) == (1, calls)
    (fire,) = rig.fires(timer["id"])
    assert fire["status"] == "failed"
    assert reason in fire["reason"]
    assert rig.drain(rig.api.queues["acme"]) == []


class LossySqs:
    """Calls fail by script: a connection refused before the request went, or a read timeout
    after SQS took the batch (the answer is lost)."""

    def __init__(self, rig: Rig, errors: Sequence[Exception]) -> None:
        self.rig, self.errors = rig, list(errors)

    def send_message_batch(self, *, QueueUrl: str, Entries: Sequence[Any]) -> Any:
        error = self.errors.pop(0) if self.errors else None
        if isinstance(error, EndpointConnectionError):
            raise error
        answer = self.rig.sqs.send_message_batch(QueueUrl=QueueUrl, Entries=Entries)
        if error is not None:
            raise error
        return answer


def test_a_send_whose_answer_is_lost_is_retried_and_counted_ambiguous(rig: Rig) -> None:
    # The documented duplicate window: the retry sends the callback again (same fire_id), and
    # the run says so. A refused connection (the request never went) is retried silently.
    timer = rig.api.create(schedule=after(1))
    rig.clock.now = T0 + 1_000
    lost = ReadTimeoutError(endpoint_url="http://sqs")
    refused = EndpointConnectionError(endpoint_url="http://sqs")
    (report,) = rig.run(sqs=LossySqs(rig, [refused, lost]))
    assert (report.enqueued, report.ambiguous) == (1, 1)
    messages = rig.drain(rig.api.queues["acme"])
    assert [m["timer_id"] for m in messages] == [timer["id"]] * 2
    assert len({m["fire_id"] for m in messages}) == 1
    assert [f["status"] for f in rig.fires(timer["id"])] == ["enqueued"]


class GatedSqs:
    """Sends to ``slow`` wait (without sleeping) until a send to any other queue went out."""

    def __init__(self, rig: Rig, slow: str) -> None:
        self.rig, self.slow = rig, slow
        self.other_sent = threading.Event()
        self.waited: list[bool] = []

    def send_message_batch(self, *, QueueUrl: str, Entries: Sequence[Any]) -> Any:
        if QueueUrl == self.slow:
            self.waited.append(self.other_sent.wait(timeout=10))
            return self.rig.sqs.send_message_batch(QueueUrl=QueueUrl, Entries=Entries)
        response = self.rig.sqs.send_message_batch(QueueUrl=QueueUrl, Entries=Entries)
        self.other_sent.set()
        return response


def test_a_slow_queue_does_not_hold_up_another(rig: Rig) -> None:
    rig.api.create(schedule=after(1))
    rig.api.create("globex", schedule=after(1))
    gated = GatedSqs(rig, slow=rig.api.queues["acme"])
    rig.clock.now = T0 + 1_000
    (report,) = rig.run(sqs=gated)
    assert gated.waited == [True]  # globex went out while acme's send was still in flight
    assert report.enqueued == 2


# ---------------------------------------------------------------- volume and fairness


def create_many(rig: Rig, tenant: str, count: int, at: Sequence[int]) -> list[dict[str, Any]]:
    """``count`` one-shots due at the times of ``at`` in turn, created in batches of 100."""
    created: list[dict[str, Any]] = []
    for start in range(0, count, 100):
        batch = [{"schedule": {"type": "at", "at": format_ms(at[i % len(at)])}, "payload": i}
                 for i in range(start, min(count, start + 100))]  # fmt: skip
        reply = rig.api.call("POST", "/v1/timers:batch", tenant=tenant, body={"timers": batch})
        assert reply.status == 201, reply.body
        created += reply.body["items"]
    return created


class SinkSqs:
    """Accepts every message and keeps none: moto's SQS slows down with queue depth, and a
    2,000-message run is about the trigger, not the queue (other tests read real queues)."""

    def send_message_batch(self, *, QueueUrl: str, Entries: Sequence[Any]) -> Any:
        return {"Successful": [{"Id": e["Id"]} for e in Entries], "Failed": []}


def test_two_thousand_timers_due_in_one_second_fire_once_each(rig: Rig) -> None:
    created = create_many(rig, "acme", 2_000, [T0 + 1_000])
    rig.sqs.real = SinkSqs()
    rig.clock.now = T0 + 1_000
    (report,) = rig.run()  # one run drains it, a lease (of LEASE_LIMIT) at a time
    assert report.enqueued == 2_000
    assert rig.per_fire() == Counter({f"{t['id']}:{T0 + 1_000}": 1 for t in created})
    shown = rig.api.call("GET", "/v1/timers", query={"status": "completed", "limit": "100"})
    assert len(shown.body["items"]) == 100  # derived from the claim items: all fired


def claim_items(rig: Rig) -> dict[str, dict[str, Any]]:
    client = boto3.client("dynamodb")
    items = client.scan(TableName=rig.log.table)["Items"]
    return {item["k"]["S"]: item for item in items}


def test_a_hot_second_seals_full_claim_items_and_fires_each_position_once(rig: Rig) -> None:
    """Issue 16, defect 2: one tenant's fires of one second all live in one claim item, which
    DynamoDB refuses past 400 KB. Items take at most CLAIM_CAP entries; a full one is sealed
    and its positions live in child items - late at worst, never stuck."""
    rig.api.tenants.set_spread("acme", 1)  # every timer in one claim partition
    rig.log.cap = 8
    created = create_many(rig, "acme", 120, [T0 + 1_000])
    rig.sqs.real = SinkSqs()
    rig.clock.now = T0 + 1_000
    rig.run_until_idle()
    assert rig.per_fire() == Counter({f"{t['id']}:{T0 + 1_000}": 1 for t in created})
    items = claim_items(rig)
    assert len(items) > 120 // 8  # the root and its children, as deep as needed
    for key, item in items.items():
        entries = [name for name in item if "@" in name]
        assert len(entries) <= 8, key
    sealed = [key for key, item in items.items() if "sl" in item]
    assert sealed and all(len([n for n in items[k] if "@" in n]) <= 8 for k in sealed)
    shown = rig.api.call("GET", f"/v1/timers/{created[-1]['id']}/fires").body["items"]
    assert [f["status"] for f in shown] == ["enqueued"]  # found through the sealed items


def test_claims_go_below_the_full_items_a_run_has_seen(rig: Rig) -> None:
    """A sealed item never gains an entry, so once a run has read one whole, it claims the
    positions that item lacks in the children at once: each full item is written to in vain
    once, not once per chunk (a failed write costs the whole item's size)."""
    rig.api.tenants.set_spread("acme", 1)
    rig.log.cap = 8
    created = create_many(rig, "acme", 120, [T0 + 1_000])
    rig.sqs.real = SinkSqs()
    refused: list[str] = []
    claim = rig.log.claim

    def watched(key: str, entries: Any, seen: Any = None) -> bool:
        ok = claim(key, entries, seen)
        refused.extend([] if ok else [key])
        return ok

    rig.log.claim = watched  # type: ignore[method-assign]
    rig.clock.now = T0 + 1_000
    rig.run_until_idle()
    assert rig.per_fire() == Counter({f"{t['id']}:{T0 + 1_000}": 1 for t in created})
    # at most once (none where the run's own claims filled it); without the routing ~28 at the root
    assert max(Counter(refused).values(), default=0) <= 1


def floor_above_count(rig: Rig) -> dict[str, tuple[int, int]]:
    """Items whose count the sandbox's fire log knows as higher than the stored one (the floor
    read first: the stored counts only grow meanwhile)."""
    floor = dict(rig.log._filled)
    stored = {k: int(item["c"]["N"]) if "c" in item else 0 for k, item in claim_items(rig).items()}
    return {k: (f, stored.get(k, 0)) for k, f in floor.items() if f > stored.get(k, 0)}


def test_a_claim_is_skipped_only_where_dynamodb_would_refuse_it(rig: Rig) -> None:
    """A claim is not written to an item the sandbox's own claims filled: its count as last
    known is never above the stored one - checked before every claim of a hot second in items
    of 8 and leases of 24, and with claims applied whose answers timed out (their retries meet
    their own entries: ours, counted once)."""
    rig.api.tenants.set_spread("acme", 1)
    rig.log.cap = 8
    created = create_many(rig, "acme", 150, [T0 + 1_000])
    rig.sqs.real = SinkSqs()
    claim, write = rig.log.claim, rig.log._write
    timed_out: list[str] = []

    def watched(key: str, entries: Any, seen: Any = None) -> bool:
        assert not floor_above_count(rig)
        return claim(key, entries, seen)

    def flaky(key: str, update: str, condition: str, names: Any, values: Any, **kw: Any) -> bool:
        ok = write(key, update, condition, names, values, **kw)
        if ok and ":k" in values and len(timed_out) < 6:  # a claim, applied, its answer lost
            timed_out.append(key)
            raise ReadTimeoutError(endpoint_url="http://dynamodb")
        return ok

    rig.log.claim = watched  # type: ignore[method-assign]
    rig.log._write = flaky  # type: ignore[method-assign]
    rig.clock.now = T0 + 1_000
    rig.run_until_idle(lease_limit=24)
    assert len(timed_out) == 6 and not floor_above_count(rig)
    assert rig.per_fire() == Counter({f"{t['id']}:{T0 + 1_000}": 1 for t in created})


def test_a_change_fences_its_cursor_below_a_full_item(rig: Rig) -> None:
    """A fence is a new attribute too: in a full item it goes to the child, where the member
    of the older revision finds it."""
    rig.api.tenants.set_spread("acme", 1)
    rig.log.cap = 8
    timer = rig.api.create(schedule={"type": "at", "at": format_ms(T0 + 2_900)})
    create_many(rig, "acme", 8, [T0 + 2_000])  # they fill the root item of 10:00:02
    rig.sqs.real = SinkSqs()
    rig.clock.now = T0 + 2_000
    rig.run()
    reply = rig.api.call("PATCH", f"/v1/timers/{timer['id']}", body={"payload": "changed"})
    assert reply.status == 200
    ref = entry_ref(rig.stored(timer["id"]).partition, timer["id"], T0 + 2_900)
    at = rig.log.locate([ref], consistent=True)[ref]
    assert at.key.count("/") == 2 and at.entry == Entry("t", 2)  # the root is sealed
    rig.clock.now = T0 + 2_900
    rig.run_until_idle()
    assert rig.per_fire()[f"{timer['id']}:{T0 + 2_900}"] == 1


def test_a_lease_is_fair_across_tenants(rig: Rig) -> None:
    """Tenant A has 300 fires due in the same instant as B's one, in the same bucket: B's goes
    out in the first lease (round-robin across tenants), not after A's burst."""
    create_many(rig, "acme", 300, [T0 + 1_000])
    (lone,) = create_many(rig, "globex", 1, [T0 + 1_000])
    rig.sqs.real = SinkSqs()
    rig.clock.now = T0 + 1_000
    rig.run()
    order = [s.fire_id for s in rig.sqs.sent]
    assert order.index(f"{lone['id']}:{T0 + 1_000}") < 100


# ---------------------------------------------------------------- handler


@pytest.fixture
def sandbox(rig: Rig, monkeypatch: pytest.MonkeyPatch) -> Rig:
    """The handler wired to the rig; a sandbox's first invocation, in a sandbox that had
    initialized long before (so not a cold start) unless a test says."""
    monkeypatch.setattr(trigger_app, "wired", lambda: (rig.api.runtime.wiring, rig.deps()))
    monkeypatch.setattr(trigger_app, "_first_invocation", True)
    monkeypatch.setattr(trigger_app, "INITIALIZED_MS", T0 - 60_000)
    return rig


def test_handler_fires_its_bucket_keeps_its_marker_and_emits_one_metrics_block(
    sandbox: Rig, capsys: pytest.CaptureFixture[str]
) -> None:
    rig = sandbox
    rig.api.create(schedule=after(1))
    rig.clock.now = T0 + 1_000
    event = json.loads((EVENTS / "trigger.json").read_text())
    assert rig.index.start_run(0, 0, "fanout-token", 5_000)
    event.update(bucket=0, slot=0, token="fanout-token", at_ms=T0 + 900)

    summary = trigger_app.handler(event, LambdaContext(function_name="trigger"))
    assert (summary["leased"], summary["enqueued"], summary["failed"]) == (1, 1, 0)
    emitted = [json.loads(line) for line in capsys.readouterr().out.splitlines() if "_aws" in line]
    (metrics,) = emitted
    assert metrics["FiresEnqueued"] == [1.0]
    assert metrics["FiresLag_1-200ms"] == [1.0]  # its accuracy level; the others left out
    assert [k for k in metrics if k.startswith("FiresLag_")] == ["FiresLag_1-200ms"]
    assert metrics["InvokeDelayMs"] == [100.0]
    assert rig.index.start_run(0, 0, "next", 5_000)  # the run cleared its marker
    assert len(rig.drain(rig.api.queues["acme"])) == 1
    assert rig.index.field(0, keys.COLD) is None  # the sandbox was up before the invoke


def test_a_cold_trigger_records_its_cold_start_for_the_fanout_once(
    sandbox: Rig, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    rig = sandbox
    monkeypatch.setattr(trigger_app, "INITIALIZED_MS", T0 + 1_700)  # imported after the invoke
    rig.clock.now = T0 + 2_000
    event = {"bucket": 0, "at_ms": T0 + 1_100}  # the fan-out invoked it 900 ms ago

    trigger_app.handler(event, LambdaContext(function_name="trigger"))
    assert rig.index.field(0, keys.COLD) == "900"
    (line,) = [r for r in caplog.records if r.getMessage() == "trigger run"]
    assert line.__dict__["cold_start_ms"] == 900  # an ``extra`` field

    rig.clock.now = T0 + 3_000  # the same sandbox again: warm, whatever the delay
    trigger_app.handler({**event, "at_ms": T0 + 1_000}, LambdaContext(function_name="trigger"))
    assert rig.index.field(0, keys.COLD) == "900"


def test_a_cold_start_that_cannot_be_recorded_does_not_fail_the_run(
    sandbox: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    rig = sandbox
    rig.api.create(schedule=after(1))
    rig.clock.now = T0 + 1_000
    monkeypatch.setattr(trigger_app, "INITIALIZED_MS", T0 + 950)

    def down(bucket: int, sample_ms: int) -> None:
        raise redis.ConnectionError("failover")

    monkeypatch.setattr(trigger_app, "record_cold_start", down)
    event = {"bucket": 0, "at_ms": T0 + 900}
    summary = trigger_app.handler(event, LambdaContext(function_name="trigger"))
    assert summary["enqueued"] == 1


def test_a_run_with_a_marker_clears_it_when_it_ends(rig: Rig) -> None:
    """So the fan-out's next peek can start the bucket again for what came due meanwhile."""
    rig.api.create(schedule={"type": "every", "seconds": 10})
    rig.clock.now = T0 + 10_000
    assert rig.index.start_run(0, 0, "t", 5_000)
    run_trigger(rig.deps(), 0, REMAINING_MS, RunMarker(0, "t"))
    assert rig.index.start_run(0, 0, "next", 5_000)


def test_a_run_frees_its_slot_when_it_stops_leasing_and_clears_it_when_it_ends(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once a run leases no more its marker says so (``~``) while it finishes (its sends, its
    counts): the fan-out may start the bucket again at once, and counts the finishing run
    among those in flight; at its very end the marker goes."""
    rig.api.create(schedule=after(10))
    rig.clock.now = T0 + 10_000
    assert rig.index.start_run(0, 0, "t", 5_000)
    before_end: list[str | None] = []
    end_run = rig.index.end_run

    def watched(bucket: int, slot: int, token: str) -> bool:
        before_end.append(rig.index.runs({(bucket, slot)})[(bucket, slot)])
        return end_run(bucket, slot, token)

    monkeypatch.setattr(rig.index, "end_run", watched)
    run_trigger(rig.deps(), 0, REMAINING_MS, RunMarker(0, "t"))
    assert before_end == ["t~"]  # it leased no more: finishing, the slot free
    assert rig.index.runs({(0, 0)}) == {(0, 0): None}  # then over


@pytest.mark.parametrize("event", [{}, {"bucket": "7"}, {"bucket": -1}, {"bucket": True}])
def test_handler_rejects_an_event_without_a_bucket(event: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="bucket"):
        trigger_app.TriggerEvent.parse(event)


# ---------------------------------------------------------------- usage


def test_a_run_counts_what_it_recorded_in_the_tenants_usage(rig: Rig) -> None:
    api = rig.api
    for _ in range(3):
        api.create(schedule=after(1))
    api.create(schedule={"type": "every", "seconds": 1}, max_fires=1)
    until_armed(rig, T0 + 1_000)
    rig.run()
    used = api.call("GET", "/v1/tenant/usage").body
    assert used["fires"] == {"enqueued": 4, "delivered": 0, "failed": 0, "late_1s": 0}
    assert (used["timers_created"], used["active_timers"]) == (4, 0)  # each ended with its fire
    late = api.create(schedule=after(1))
    rig.clock.now = T0 + 4_000  # 2 s late: the service was down
    rig.run()
    assert [f["status"] for f in rig.fires(late["id"])] == ["enqueued"]
    used = api.call("GET", "/v1/tenant/usage").body
    assert used["fires"]["late_1s"] == 1 and used["fires"]["enqueued"] == 5


def test_every_enqueued_fire_counts_in_one_accuracy_level(rig: Rig) -> None:
    """On time, sent late by a slow SQS, found late by a run (the service down), run now, and a
    failed fire: each enqueued fire is in exactly one level, by its enqueue time minus its due
    time, so the six levels add up to ``fires.enqueued``."""
    api = rig.api
    gone = rig.sqs.real.create_queue(QueueName="timers-tenant-acme-gone")["QueueUrl"]
    api.tenants.allow_queue("acme", gone)
    rig.clock.advance(AUTH_CACHE_MS)

    def fire_one_shots(n: int, late_ms: int = 0, sqs_ms: int = 0, **extra: Any) -> list[str]:
        made = [api.create(schedule=after(1), **extra)["id"] for _ in range(n)]
        due = rig.clock() + 1_000
        if late_ms:
            rig.clock.now = due + late_ms  # the service was down: the run finds them late
        else:
            until_armed(rig, due)  # armed: the run waits for the due instant
        rig.sqs.delay_ms = sqs_ms  # each send takes this long
        try:
            rig.run()
        finally:
            rig.sqs.delay_ms = 0
        return made

    on_time = fire_one_shots(2)
    fire_one_shots(3, sqs_ms=300)  # one batch, enqueued 300 ms after due: 200-600ms
    fire_one_shots(1, late_ms=700)
    fire_one_shots(2, late_ms=1_500)
    fire_one_shots(1, late_ms=2_001)
    fire_one_shots(1, late_ms=60_000)
    rig.sqs.real.delete_queue(QueueUrl=gone)
    (failed,) = fire_one_shots(1, target={"queue_url": gone})
    assert [f["status"] for f in rig.fires(failed)] == ["failed"]
    assert api.call("POST", f"/v1/timers/{on_time[0]}/run").status == 202  # lag from its own
    assert api.call("POST", f"/v1/timers/{on_time[1]}/run").status == 202  # position

    used = rig.usage()
    assert used["fires"] == {"enqueued": 12, "delivered": 0, "failed": 1, "late_1s": 4}
    # ontime is L = 0: an armed run sends once the reference time is past due (SEND_GUARD_MS),
    # and run now a few ms after its position, so with no window they are 1-200ms
    assert used["lag"] == {"ontime": 0, "1-200ms": 4, "200-600ms": 3, "600-1000ms": 1,
                           "1000-2000ms": 2, "over_2000ms": 2}  # fmt: skip
    assert sum(used["lag"].values()) == used["fires"]["enqueued"]


# ---------------------------------------------------------------- within the timeout


@contextlib.contextmanager
def slow_aws(rig: Rig, ms: int) -> Iterator[None]:
    """Every DynamoDB call takes ``ms`` of the rig's clock (the trigger's time); calls made at
    once (the claims of a lease's items, in parallel) overlap: each ends ``ms`` after it began."""
    original = botocore.client.BaseClient._make_api_call
    lock = threading.Lock()

    def slow(client: Any, operation: str, params: dict[str, Any]) -> Any:
        began = rig.clock()
        try:
            return original(client, operation, params)
        finally:
            time.sleep(0.02)  # calls made at once overlap on the wall clock too, so here
            with lock:
                rig.clock.now = max(rig.clock.now, began + ms)

    botocore.client.BaseClient._make_api_call = slow  # type: ignore[method-assign]
    try:
        yield
    finally:
        botocore.client.BaseClient._make_api_call = original  # type: ignore[method-assign]


@pytest.mark.parametrize("call_ms", [300, 1_200, 2_900])
def test_a_run_ends_before_its_timeout_however_slow_each_call_is(rig: Rig, call_ms: int) -> None:
    """Lambda kills a run at its timeout, mid-call (issue 36: 38 runs killed in a hot second).
    However slow DynamoDB and SQS answer - each call within its client's timeout - a run hands
    back what it will not finish and returns before REMAINING_MS; runs after it fire each timer
    once, never early."""
    created = create_many(rig, "acme", 400, [T0 + 1_000])
    rig.sqs.real = SinkSqs()
    rig.sqs.delay_ms = call_ms
    rig.clock.now = T0 + 1_000
    pace = Pace()  # one sandbox's runs, one after another
    with slow_aws(rig, call_ms):
        for _ in range(60):
            if not (buckets := rig.due_buckets()):
                break
            for bucket in buckets:
                started = rig.clock()
                run_trigger(rig.deps(pace=pace), bucket, REMAINING_MS)
                assert rig.clock() - started < REMAINING_MS, (
                    f"killed at its timeout ({call_ms} ms calls)"
                )
            drain_usage()
            rig.clock.advance(LAPSE_MS)  # what a run gave back or left is due again
    assert rig.per_fire() == Counter({f"{t['id']}:{T0 + 1_000}": 1 for t in created})
    assert all(s.at >= s.scheduled for s in rig.sqs.sent)


# ---------------------------------------------------------------- the flexible window


def windowed(rig: Rig, dues: Sequence[int], window_s: float, **more: Any) -> list[dict[str, Any]]:
    """One-shots with a window, due at ``dues``, made in one batch request."""
    timers = [{"schedule": {"type": "at", "at": format_ms(d)}, "payload": i,
               "window_seconds": window_s, **more} for i, d in enumerate(dues)]  # fmt: skip
    reply = rig.api.call("POST", "/v1/timers:batch", body={"timers": timers})
    assert reply.status == 201, reply.body
    return list(reply.body["items"])


def instant_of(rig: Rig, timer: dict[str, Any], due: int) -> int:
    """When the service sends this timer's fire due at ``due``."""
    stored = rig.stored(timer["id"])
    return send_at(due, stored.window_ms, stored.grain_ms, stored.partition)


def test_windowed_fires_of_a_partition_due_within_a_grain_are_sent_together(rig: Rig) -> None:
    """The point of a window: 25 one-shots with a 60 s window due at 25 different seconds go
    out at one aligned instant - one run, two claim writes (its first lease of 10, then the
    rest), SQS batches of ten - where on the dot they would take 25 of each. Never before
    their due times, all within their windows; fire ids and scheduled_at stay nominal."""
    (probe,) = windowed(rig, [T0 + 40_000], 60)
    instant = instant_of(rig, probe, T0 + 40_000)
    rig.api.call("DELETE", f"/v1/timers/{probe['id']}")
    dues = [instant - 29_000 + i * 1_000 for i in range(25)]  # one grain (30 s) before it
    made = windowed(rig, dues, 60)
    assert {instant_of(rig, t, d) for t, d in zip(made, dues, strict=True)} == {instant}
    claims: list[int] = []
    claim = rig.log.claim

    def counted(key: str, entries: Any, seen: Any = None) -> bool:
        claims.append(len(entries))
        return claim(key, entries, seen)

    rig.log.claim = counted  # type: ignore[method-assign]
    rig.clock.now = dues[0]
    assert rig.run() == []  # due, but not sent yet: the instant is later
    until_armed(rig, instant)
    reports = rig.run()
    assert len(reports) == 1 and reports[0].enqueued == 25
    assert claims == [10, 15]
    assert rig.per_fire() == Counter({f"{t['id']}:{d}": 1 for t, d in zip(made, dues, strict=True)})
    assert all(instant <= s.at <= instant + 5 for s in rig.sqs.sent)  # at the instant, together
    assert all(s.scheduled <= s.at <= s.scheduled + 60_000 for s in rig.sqs.sent)
    shown = rig.fires(made[0]["id"])
    assert shown[0]["scheduled_at"] == format_ms(dues[0])
    assert 29_000 <= shown[0]["lag_ms"] <= 29_005  # counted from the due time


def test_a_windowed_crowd_writes_each_claim_item_whole_and_none_in_vain(rig: Rig) -> None:
    """A write costs its item's whole size. An instant's crowd is leased in the order of its
    fire-log paths (``Card.score``), so its leases fill one item after another: each item is
    claimed and recorded by at most two writes (a lease's slice may straddle two items), and
    an item the run filled itself is sealed without a claim written to it in vain."""
    rig.log.cap = 8
    (probe,) = windowed(rig, [T0 + 400_000], 60)  # the tenant's partition: its fence elsewhere
    instant = instant_of(rig, probe, T0 + 40_000)
    rig.api.call("DELETE", f"/v1/timers/{probe['id']}")
    dues = [instant - 29_000 + i * 300 for i in range(96)]
    made = windowed(rig, dues, 60)
    claims: Counter[str] = Counter()
    records: Counter[str] = Counter()
    refused: list[str] = []
    claim, record = rig.log.claim, rig.log.record

    def claimed(key: str, entries: Any, seen: Any = None) -> bool:
        claims[key] += 1
        ok = claim(key, entries, seen)
        refused.extend([] if ok else [key])
        return ok

    def recorded(key: str, owner: str, entries: Any, release: bool = False) -> bool:
        records[key] += 1
        return record(key, owner, entries, release)

    rig.log.claim = claimed  # type: ignore[method-assign]
    rig.log.record = recorded  # type: ignore[method-assign]
    until_armed(rig, instant)
    rig.run_until_idle(lease_limit=24)  # leases of 24, items of 8: a lease's slice spans items
    assert rig.per_fire() == Counter({f"{t['id']}:{d}": 1 for t, d in zip(made, dues, strict=True)})
    assert len(claims) >= 96 // 8 and refused == []
    assert max(claims.values()) <= 2 and max(records.values()) <= 2, (claims, records)


@pytest.mark.parametrize("misfire", ["fire_once", "skip"])
def test_windowed_fires_later_than_the_misfire_grace_within_their_window_all_go(
    rig: Rig, misfire: str
) -> None:
    """A timer every 10 s with a 120 s window aligns its fires to one instant a minute: by
    then the first is 50 s late - more than MISFIRE_GRACE_MS - and five newer ones are due too.
    Within its window a fire is on time, never a missed occurrence: all six go, in order
    (``fire_once`` would send only the latest, ``skip`` none but the latest)."""
    (probe,) = windowed(rig, [T0 + 600_000], 120)  # the tenant's windowed partition, its phase
    instant = instant_of(rig, probe, T0 + 600_000)
    rig.api.call("DELETE", f"/v1/timers/{probe['id']}")
    first = instant - 50_000  # the grain is 60 s: six fires 10 s apart before the instant
    rig.clock.now = first - 60_000  # within the look-ahead: the create puts it in Redis
    timer = rig.api.create(schedule={"type": "every", "seconds": 10}, misfire=misfire,
                           window_seconds=120, start_at=format_ms(first))  # fmt: skip
    dues = [first + i * 10_000 for i in range(6)]
    assert {instant_of(rig, timer, d) for d in dues} == {instant}
    assert instant - first > MISFIRE_GRACE_MS
    until_armed(rig, instant)
    rig.run()
    assert [s.scheduled for s in rig.sqs.sent] == dues


def test_a_window_patched_to_zero_fires_on_the_dot_from_its_fire_log_home(rig: Rig) -> None:
    """A window changed later moves the send instant only; the entries stay where the grain of
    the timer's creation put them, for every revision."""
    timer = rig.api.create(schedule={"type": "every", "seconds": 60}, window_seconds=60,
                           start_at=format_ms(T0 + 60_000))  # fmt: skip
    patched = rig.api.call("PATCH", f"/v1/timers/{timer['id']}", body={"window_seconds": 0})
    assert (patched.status, patched.body["window_seconds"]) == (200, 0)
    assert rig.stored(timer["id"]).grain_ms == 30_000  # fixed at creation
    until_armed(rig, T0 + 60_000)
    rig.run()
    ((scheduled, at),) = [(s.scheduled, s.at) for s in rig.sqs.sent]
    assert scheduled == T0 + 60_000 <= at <= T0 + 60_005  # on the dot
    (fire,) = rig.fires(timer["id"])
    assert fire["status"] == "enqueued"


def test_windowed_fires_are_on_time_in_usage_within_their_window(rig: Rig) -> None:
    made = windowed(rig, [T0 + 5_000 + i * 7_000 for i in range(4)], 120)
    rig.clock.now = T0 + 5_000
    for _ in range(80):
        rig.run()
        rig.clock.advance(1_000)
    assert len(rig.per_fire()) == len(made)
    used = rig.usage()
    assert used["lag"]["ontime"] == len(made) == used["fires"]["enqueued"]
    assert used["fires"]["late_1s"] == 0


def test_a_crowd_of_two_tenants_sends_its_first_round_first(rig: Rig) -> None:
    """25 fires of acme and one of globex due together in one bucket: the run's first lease
    takes FIRST_LEASE and holds both tenants (leases are fair), so globex's fire is claimed
    with that first round, before the rest of acme's crowd is leased."""
    due = T0 + 5_000
    for _ in range(25):
        rig.api.create(schedule={"type": "at", "at": format_ms(due)})
    lone = rig.api.create(schedule={"type": "at", "at": format_ms(due)}, tenant="globex")
    leases: list[set[str]] = []
    lease = rig.index.lease

    def watched(*args: Any, **kwargs: Any) -> Any:
        leased = lease(*args, **kwargs)
        leases.append({c.timer.tenant for c in leased.cards} | {f"n={len(leased.cards)}"})
        return leased

    rig.index.lease = watched  # type: ignore[method-assign]
    until_armed(rig, due)
    (report,) = rig.run()
    assert report.enqueued == 26 and report.leases >= 2
    assert leases[0] == {"acme", "globex", f"n={FIRST_LEASE}"}
    assert rig.per_fire()[f"{lone['id']}:{due}"] == 1

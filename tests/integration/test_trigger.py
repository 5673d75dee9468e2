"""The trigger against moto (DynamoDB, SQS) and a real redis-server, time injected.

Which test guards which invariant (pure decisions: tests/unit/test_firing.py):
1 never early   - every drained message (``Rig.drain``), test_nothing_fires_before_its_due_time,
                  test_a_member_not_yet_due_by_its_own_time_is_released_unfired
2 never lost    - test_a_crash_at_any_step_is_finished_by_the_next_run, test_misfire_*,
                  test_a_recurring_timer_that_fell_behind_catches_up_in_one_run,
                  test_a_stale_member_puts_its_timers_current_cursor_back_in_redis,
                  test_two_thousand_timers_due_in_one_second_fire_once_each
3 one per fire  - test_a_crash_... (exactly one duplicate, only for a crash after "sent"),
                  test_two_runs_on_one_bucket_at_once_*, test_a_run_meeting_a_live_claim_*,
                  test_a_run_whose_claims_are_lapsing_does_not_send, test_fifo_targets_*
4 changes win   - test_a_change_after_the_lease_before_the_claim_wins (cancel, pause, PATCH)
5 tenants apart - test_due_timers_fire_once_with_the_contract_body (each on its own queue)
6 target fails  - test_a_deleted_queue_fails_its_fire_*, test_throttling_is_retried_*,
                  test_access_denied_*, test_a_slow_queue_does_not_hold_up_another
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError

from functions.trigger import app as trigger_app
from ops.local.context import LambdaContext
from tests.integration.api_harness import SETTINGS, Api, make_api
from tests.support.callbacks import drain
from tests.support.clock import T0, FakeClock
from timers import tenants
from timers.core import timer as timers
from timers.core.schedule import AtSchedule
from timers.core.times import format_ms, parse_ms
from timers.firing import (
    BATCH_LIMIT,
    CLAIM_MS,
    LEASE_MS,
    SEND_ATTEMPTS,
    SEND_MARGIN_MS,
    STEPS,
    TriggerDeps,
    TriggerReport,
    run_trigger,
)
from timers.redis_index import RedisIndex, bucket_of, member
from timers.store import FireClaims, TimerStore

pytestmark = pytest.mark.integration

EVENTS = Path(__file__).resolve().parents[2] / "events"


class Crash(Exception):
    """Stands for the trigger dying at a step (Lambda timeout, OOM, host failure)."""


def crash_at(step: str) -> Callable[[str], None]:
    def hook(current: str) -> None:
        if current == step:
            raise Crash(step)

    return hook


@dataclass
class Rig:
    api: Api
    index: RedisIndex
    sqs: Any
    clock: FakeClock

    def deps(self, sqs: Any = None, **overrides: Any) -> TriggerDeps:
        wiring: dict[str, Any] = {
            "index": self.index,
            "sqs": sqs or self.sqs,
            "timers": self.api.runtime.service.timers,
            "fires": FireClaims(SETTINGS.fire_retention_days),
            "clock": self.clock,
            "lookahead_ms": SETTINGS.lookahead_seconds * 1000,
            "sleep": lambda seconds: None,  # no real sleeps: time is injected
        }
        return TriggerDeps(**{**wiring, **overrides})

    def run(self, **overrides: Any) -> list[TriggerReport]:
        """One trigger run for every bucket with due work, as one fan-out tick would start."""
        due = self.index.due_counts(range(self.index.bucket_count), self.clock())
        return [run_trigger(self.deps(**overrides), bucket) for bucket in sorted(due)]

    def run_until_idle(self, **overrides: Any) -> list[TriggerReport]:
        reports: list[TriggerReport] = []
        for _ in range(100):
            ran = self.run(**overrides)
            if not ran:
                return reports
            reports += ran
        raise AssertionError("the trigger never ran out of due work")

    def drain(self, queue_url: str) -> list[dict[str, Any]]:
        """Every message on the queue (deleted as read); asserts the contract and never-early."""
        return drain(self.sqs, queue_url, self.clock())

    def fires(self, timer_id: str, tenant: str = "acme") -> list[dict[str, Any]]:
        reply = self.api.call("GET", f"/v1/timers/{timer_id}/fires", tenant=tenant)
        assert reply.status == 200, reply.body
        return list(reply.body["items"])

    def timer(self, timer_id: str, tenant: str = "acme") -> dict[str, Any]:
        return dict(self.api.call("GET", f"/v1/timers/{timer_id}", tenant=tenant).body)

    def indexed(self) -> set[str]:
        """Every occurrence waiting in Redis (due, not leased)."""
        conn = self.api.runtime.redis
        return {
            m
            for b in range(self.index.bucket_count)
            for m in conn.zrange(self.index.keys(b).due, 0, -1)
        }


def rig_with(api: Api, clock: FakeClock, buckets: int) -> Rig:
    # The api's fast path and the trigger must agree on the bucket count.
    index = RedisIndex(api.runtime.redis, buckets)
    api.runtime.service.index = index
    return Rig(api, index, boto3.client("sqs"), clock)


@pytest.fixture
def rig(
    aws: None, clock: FakeClock, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Rig]:
    """Every timer in one bucket, so a test's timers share a batch."""
    yield rig_with(make_api(monkeypatch, clock, redis_url), clock, buckets=1)


@pytest.fixture
def spread_rig(
    aws: None, clock: FakeClock, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Rig]:
    """The deployment's bucket count: timers spread over buckets, one run per due bucket."""
    yield rig_with(make_api(monkeypatch, clock, redis_url), clock, buckets=SETTINGS.bucket_count)


def after(seconds: float) -> dict[str, Any]:
    return {"type": "after", "seconds": seconds}


# ---------------------------------------------------------------- the fire path


def test_due_timers_fire_once_with_the_contract_body(spread_rig: Rig) -> None:
    rig, api = spread_rig, spread_rig.api
    payload = {"order": 42, "note": "grüße", "nested": [1.5, None, True]}
    one = api.create(schedule=after(2), payload=payload, name="reminder")
    every = api.create(schedule={"type": "every", "seconds": 1})
    theirs = api.create("globex", schedule=after(2), payload="x")

    rig.clock.advance(1_000)
    rig.run()
    assert member("acme", every["id"], T0 + 2_000) in rig.indexed()  # chained at once
    rig.clock.advance(1_000)
    reports = rig.run()
    assert sum(r.enqueued for r in reports) == 3
    assert {lag for r in reports for lag in r.lags_ms} == {0}
    assert rig.run() == []  # nothing left due: each fire went out once

    acme = {(m["timer_id"], m["scheduled_at"]): m for m in rig.drain(api.queues["acme"])}
    assert set(acme) == {
        (every["id"], format_ms(T0 + 1_000)),
        (every["id"], format_ms(T0 + 2_000)),
        (one["id"], format_ms(T0 + 2_000)),
    }
    body = acme[(one["id"], format_ms(T0 + 2_000))]
    del body["_attributes"]
    assert body == {
        "fire_id": f"{one['id']}:{T0 + 2_000}",
        "timer_id": one["id"],
        "tenant": "acme",
        "name": "reminder",
        "scheduled_at": "2026-11-21T10:00:02.000Z",
        "fired_at": "2026-11-21T10:00:02.000Z",
        "payload": payload,
    }
    assert [m["timer_id"] for m in rig.drain(api.queues["globex"])] == [theirs["id"]]

    assert rig.timer(one["id"])["status"] == "completed"
    assert rig.fires(one["id"]) == [
        {
            "fire_id": f"{one['id']}:{T0 + 2_000}",
            "scheduled_at": "2026-11-21T10:00:02.000Z",
            "enqueued_at": "2026-11-21T10:00:02.000Z",
            "lag_ms": 0,
            "status": "enqueued",
            "reason": None,
        }
    ]
    recurring = rig.timer(every["id"])
    assert (recurring["status"], recurring["fire_count"]) == ("active", 2)
    assert recurring["next_fire_at"] == format_ms(T0 + 3_000)
    assert member("acme", every["id"], T0 + 3_000) in rig.indexed()


def test_nothing_fires_before_its_due_time(rig: Rig) -> None:
    timer = rig.api.create(schedule=after(5))
    rig.clock.advance(4_999)
    assert [r.leased for r in run_all_buckets(rig)] == [0]
    assert rig.drain(rig.api.queues["acme"]) == []
    assert rig.fires(timer["id"]) == []
    rig.clock.advance(1)
    assert sum(r.enqueued for r in rig.run()) == 1
    (message,) = rig.drain(rig.api.queues["acme"])
    assert message["fired_at"] == message["scheduled_at"] == format_ms(T0 + 5_000)


def run_all_buckets(rig: Rig) -> list[TriggerReport]:
    """A run on every bucket whether or not the index reports work (a stray invocation)."""
    return [run_trigger(rig.deps(), b) for b in range(rig.index.bucket_count)]


@pytest.mark.parametrize("step", STEPS)
def test_a_crash_at_any_step_is_finished_by_the_next_run(rig: Rig, step: str) -> None:
    queue = rig.api.queues["acme"]
    one = rig.api.create(schedule=after(1), payload={"n": 1})
    every = rig.api.create(schedule={"type": "every", "seconds": 60}, payload={"n": 2})
    rig.clock.advance(60_000)
    with pytest.raises(Crash):
        rig.run(hooks=crash_at(step))
    sent = rig.drain(queue)
    assert len(sent) == (0 if STEPS.index(step) < STEPS.index("sent") else 2)

    # Until the dead run's lease expires its members are nobody else's to fire.
    assert rig.run() == []
    rig.clock.advance(max(LEASE_MS, CLAIM_MS) + 1)
    reports = rig.run_until_idle()
    assert sum(r.reclaimed for r in reports) == 2
    sent += rig.drain(queue)

    per_fire = Counter(m["fire_id"] for m in sent)
    expected = {f"{one['id']}:{T0 + 1_000}", f"{every['id']}:{T0 + 60_000}"}
    assert set(per_fire) == expected  # never lost
    # one callback per fire, except the documented window: sent, then died before recording
    assert set(per_fire.values()) == {2 if step == "sent" else 1}
    assert [f["status"] for f in rig.fires(one["id"])] == ["enqueued"]
    assert rig.timer(one["id"])["status"] == "completed"
    recurring = rig.timer(every["id"])
    assert (recurring["fire_count"], recurring["next_fire_at"]) == (1, format_ms(T0 + 120_000))
    assert member("acme", every["id"], T0 + 120_000) in rig.indexed()


def test_a_recurring_timer_that_fell_behind_catches_up_in_one_run(rig: Rig) -> None:
    """An `every 1 s` timer 35 s behind (a crashed run's lease had to expire) is back on
    schedule after one fan-out tick, not stuck 35 s late firing once per tick."""
    every = rig.api.create(schedule={"type": "every", "seconds": 1})
    rig.clock.advance(1_000)
    with pytest.raises(Crash):
        rig.run(hooks=crash_at("claimed"))
    rig.clock.advance(LEASE_MS + 1)  # now T0 + 36.001 s

    (recovery,) = rig.run()
    sent = rig.drain(rig.api.queues["acme"])
    assert [parse_ms(m["scheduled_at"]) for m in sent] == [T0 + k * 1_000 for k in range(1, 37)]
    assert recovery.enqueued == 36
    assert rig.timer(every["id"])["next_fire_at"] == format_ms(T0 + 37_000)
    assert member("acme", every["id"], T0 + 37_000) in rig.indexed()


def test_two_runs_on_one_bucket_at_once_send_each_fire_once(rig: Rig) -> None:
    created = [rig.api.create(schedule=after(1), payload=i) for i in range(30)]
    rig.clock.advance(1_000)
    both_leased = threading.Barrier(2)

    def meet(step: str) -> None:
        if step == "leased":
            both_leased.wait(timeout=10)

    reports: list[TriggerReport] = []
    runs = [
        threading.Thread(
            target=lambda: reports.append(run_trigger(rig.deps(hooks=meet, batch_limit=20), 0))
        )
        for _ in range(2)
    ]
    for thread in runs:
        thread.start()
    for thread in runs:
        thread.join(timeout=30)
    assert sorted(r.leased for r in reports) == [10, 20]  # disjoint halves of one bucket
    assert rig.run_until_idle() == []
    per_fire = Counter(m["fire_id"] for m in rig.drain(rig.api.queues["acme"]))
    assert set(per_fire) == {f"{t['id']}:{T0 + 1_000}" for t in created}
    assert set(per_fire.values()) == {1}


def test_a_run_meeting_a_live_claim_leaves_it_alone(rig: Rig) -> None:
    """Redis flushed mid-run and rebuilt by the migrator: a second run leases the same member
    while the first holds the fire's claim. The claim, not the lease, keeps it to one send."""
    timer = rig.api.create(schedule=after(1))
    rig.clock.advance(1_000)
    inner: list[TriggerReport] = []

    def flush_and_rerun(step: str) -> None:
        if step == "claimed":
            rig.api.runtime.redis.flushall()
            rig.index.add([("acme", timer["id"], T0 + 1_000)])
            inner.append(run_trigger(rig.deps(), 0))

    (outer,) = rig.run(hooks=flush_and_rerun)
    assert (outer.enqueued, inner[0].held, inner[0].enqueued) == (1, 1, 0)
    rig.clock.advance(LEASE_MS + 1)
    (later,) = rig.run_until_idle()
    assert (later.reclaimed, later.stale, later.enqueued) == (1, 1, 0)
    assert len(rig.drain(rig.api.queues["acme"])) == 1
    assert rig.indexed() == set()


def test_a_run_whose_claims_are_lapsing_does_not_send(rig: Rig) -> None:
    """A trigger stalled until its claims nearly lapse must not send: a run taking them over
    will, once the stalled run's lease has expired."""
    timer = rig.api.create(schedule=after(1))
    rig.clock.advance(1_000)

    def stall(step: str) -> None:
        if step == "claimed":
            rig.clock.advance(CLAIM_MS - SEND_MARGIN_MS)

    (stalled,) = rig.run(hooks=stall)
    assert (stalled.enqueued, stalled.failed) == (0, 0)
    assert rig.drain(rig.api.queues["acme"]) == []
    assert rig.run() == []  # still leased by the stalled run
    rig.clock.advance(LEASE_MS)
    (taken_over,) = rig.run()
    assert (taken_over.reclaimed, taken_over.enqueued) == (1, 1)
    assert len(rig.drain(rig.api.queues["acme"])) == 1
    assert rig.timer(timer["id"])["status"] == "completed"
    (fire,) = rig.fires(timer["id"])
    assert fire["status"] == "enqueued"


def test_a_member_not_yet_due_by_its_own_time_is_released_unfired(rig: Rig) -> None:
    """Defence in depth for never-early: the member's due time, not only its score, decides."""
    timer = rig.api.create(schedule=after(5))
    rig.index.remove([("acme", timer["id"], T0 + 5_000)])
    corrupt = member("acme", timer["id"], T0 + 5_000)
    rig.api.runtime.redis.zadd(rig.index.keys(0).due, {corrupt: T0})  # score says due now
    (report,) = rig.run()
    assert (report.leased, report.enqueued) == (1, 0)
    assert rig.drain(rig.api.queues["acme"]) == []
    assert corrupt in rig.indexed()  # back in due, untouched


def test_a_stale_member_puts_its_timers_current_cursor_back_in_redis(rig: Rig) -> None:
    """A run that died after advancing but before indexing the next occurrence: the run that
    acks its stale member re-adds the cursor DynamoDB holds, so the timer keeps its pace."""
    every = rig.api.create(schedule={"type": "every", "seconds": 1})
    rig.clock.advance(1_000)
    with pytest.raises(Crash):
        rig.run(hooks=crash_at("advanced"))
    rig.index.remove([("acme", every["id"], T0 + 2_000)])  # as if it died before index.add
    rig.clock.advance(LEASE_MS + 1)
    (healing,) = rig.run()
    assert (healing.reclaimed, healing.stale) == (1, 1)
    assert member("acme", every["id"], T0 + 2_000) in rig.indexed()


def _cancel(rig: Rig, timer_id: str) -> None:
    assert rig.api.call("DELETE", f"/v1/timers/{timer_id}").status == 204


def _pause(rig: Rig, timer_id: str) -> None:
    assert rig.api.call("POST", f"/v1/timers/{timer_id}/pause").status == 200


def _reschedule(rig: Rig, timer_id: str) -> None:
    reply = rig.api.call("PATCH", f"/v1/timers/{timer_id}", body={"schedule": after(30)})
    assert reply.status == 200, reply.body


@pytest.mark.parametrize("change", [_cancel, _pause, _reschedule])
def test_a_change_after_the_lease_before_the_claim_wins(
    rig: Rig, change: Callable[[Rig, str], None]
) -> None:
    timer = rig.api.create(schedule=after(1))
    rig.clock.advance(1_000)

    def change_it(step: str) -> None:
        if step == "leased":
            change(rig, timer["id"])

    (report,) = rig.run(hooks=change_it)
    assert (report.leased, report.stale, report.enqueued) == (1, 1, 0)
    assert rig.drain(rig.api.queues["acme"]) == []
    if change is _cancel:
        return
    assert rig.fires(timer["id"]) == []
    if change is _pause:  # resuming later fires the one-shot once, late
        assert rig.api.call("POST", f"/v1/timers/{timer['id']}/resume").status == 200
    else:  # the new schedule fires, the old occurrence never does
        rig.clock.advance(30_000)
    rig.run_until_idle()
    (message,) = rig.drain(rig.api.queues["acme"])
    expected_due = T0 + 1_000 if change is _pause else T0 + 31_000
    assert message["scheduled_at"] == format_ms(expected_due)


@pytest.mark.parametrize(
    ("misfire", "fired_minutes"),
    [("fire_all", list(range(1, 11))), ("fire_once", [10]), ("skip", [])],
)
def test_misfire_after_an_outage(rig: Rig, misfire: str, fired_minutes: list[int]) -> None:
    queue = rig.api.queues["acme"]
    timer = rig.api.create(schedule={"type": "every", "seconds": 60}, misfire=misfire)
    # Down for ten minutes: occurrences at minutes 1..10 were missed, the latest 50 s ago.
    rig.clock.advance(10 * 60_000 + 50_000)
    sent: list[dict[str, Any]] = []
    while rig.run():  # drain after each run: messages in the order they were sent
        sent += rig.drain(queue)
    assert [parse_ms(m["scheduled_at"]) for m in sent] == [T0 + k * 60_000 for k in fired_minutes]
    assert rig.timer(timer["id"])["next_fire_at"] == format_ms(T0 + 11 * 60_000)

    rig.clock.advance(10_000)  # ... then on schedule again
    rig.run_until_idle()
    assert [m["scheduled_at"] for m in rig.drain(queue)] == [format_ms(T0 + 11 * 60_000)]


# ---------------------------------------------------------------- targets


def test_a_deleted_queue_fails_its_fire_without_holding_up_another_tenant(rig: Rig) -> None:
    doomed = rig.api.create(schedule=after(1))
    fine = rig.api.create("globex", schedule=after(1))
    rig.sqs.delete_queue(QueueUrl=rig.api.queues["acme"])
    rig.clock.advance(1_000)
    (report,) = rig.run()
    assert (report.leased, report.enqueued, report.failed) == (2, 1, 1)

    (fire,) = rig.fires(doomed["id"])
    assert fire["status"] == "failed"
    assert "NonExistentQueue" in fire["reason"] or "QueueDoesNotExist" in fire["reason"]
    assert fire["enqueued_at"] is None
    assert rig.timer(doomed["id"])["status"] == "completed"  # advanced all the same
    assert [m["timer_id"] for m in rig.drain(rig.api.queues["globex"])] == [fine["id"]]
    assert rig.run_until_idle() == []  # recorded, not retried forever


def test_fifo_targets_get_dedup_and_group_ids(rig: Rig) -> None:
    url = rig.sqs.create_queue(
        QueueName="timers-tenant-acme-orders.fifo", Attributes={"FifoQueue": "true"}
    )["QueueUrl"]
    tenants.allow_queue("acme", url)
    timer = rig.api.create(schedule={"type": "every", "seconds": 1}, target={"queue_url": url})
    rig.clock.advance(1_000)
    rig.run()
    (message,) = rig.drain(url)
    assert message["_attributes"]["MessageDeduplicationId"] == f"{timer['id']}:{T0 + 1_000}"
    assert message["_attributes"]["MessageGroupId"] == timer["id"]


class ScriptedSqs:
    """The real (moto) client behind a script of errors for chosen queues."""

    def __init__(self, real: Any, queue_url: str, script: Sequence[str | None]) -> None:
        self.real, self.queue_url, self.script = real, queue_url, list(script)
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
        return self.real.send_message_batch(QueueUrl=QueueUrl, Entries=Entries)


def test_throttling_is_retried_with_backoff_then_enqueued(rig: Rig) -> None:
    timer = rig.api.create(schedule=after(1))
    rig.clock.advance(1_000)
    flaky = ScriptedSqs(rig.sqs, rig.api.queues["acme"], ["ThrottlingException", "EntryFailure"])
    sleeps: list[float] = []
    (report,) = rig.run(sqs=flaky, sleep=sleeps.append)
    assert (report.enqueued, flaky.calls, sleeps) == (1, 3, [0.05, 0.1])
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
    rig.clock.advance(1_000)
    scripted = ScriptedSqs(rig.sqs, rig.api.queues["acme"], script)
    (report,) = rig.run(sqs=scripted)
    assert (report.failed, scripted.calls) == (1, calls)
    (fire,) = rig.fires(timer["id"])
    assert fire["status"] == "failed"
    assert reason in fire["reason"]
    assert rig.drain(rig.api.queues["acme"]) == []


class GatedSqs:
    """Sends to ``slow`` wait (without sleeping) until a send to any other queue went out."""

    def __init__(self, real: Any, slow: str) -> None:
        self.real, self.slow = real, slow
        self.other_sent = threading.Event()
        self.waited: list[bool] = []

    def send_message_batch(self, *, QueueUrl: str, Entries: Sequence[Any]) -> Any:
        if QueueUrl == self.slow:
            self.waited.append(self.other_sent.wait(timeout=10))
            return self.real.send_message_batch(QueueUrl=QueueUrl, Entries=Entries)
        response = self.real.send_message_batch(QueueUrl=QueueUrl, Entries=Entries)
        self.other_sent.set()
        return response


def test_a_slow_queue_does_not_hold_up_another(rig: Rig) -> None:
    rig.api.create(schedule=after(1))
    rig.api.create("globex", schedule=after(1))
    gated = GatedSqs(rig.sqs, slow=rig.api.queues["acme"])
    rig.clock.advance(1_000)
    (report,) = rig.run(sqs=gated)
    assert gated.waited == [True]  # globex went out while acme's send was still in flight
    assert report.enqueued == 2
    rig.drain(rig.api.queues["acme"])
    rig.drain(rig.api.queues["globex"])


# ---------------------------------------------------------------- volume


def test_two_thousand_timers_due_in_one_second_fire_once_each(rig: Rig) -> None:
    store: TimerStore = rig.api.runtime.service.timers
    queue = rig.api.queues["acme"]
    due = [T0 + 1_000 + i % 1_000 for i in range(2_000)]  # spread over one second
    created = [
        store.put(
            timers.create(
                "acme",
                timers.new_timer_id(),
                schedule=AtSchedule(at),
                target_queue_url=queue,
                payload_json=str(i),
                now_ms=T0,
            )
        )
        for i, at in enumerate(due)
    ]
    rig.index.add((t.tenant, t.id, at) for t, at in zip(created, due, strict=True))
    rig.clock.advance(2_000)

    per_fire: Counter[str] = Counter()
    runs = 0
    while rig.run():  # drained after each run: moto's receive slows down with queue depth
        runs += 1
        per_fire.update(m["fire_id"] for m in rig.drain(queue))
    assert runs == -(-2_000 // BATCH_LIMIT)
    assert set(per_fire) == {f"{t.id}:{at}" for t, at in zip(created, due, strict=True)}
    assert set(per_fire.values()) == {1}
    finished = store.get_many((t.tenant, t.id) for t in created)
    assert {t.status for t in finished.values()} == {"completed"}


# ---------------------------------------------------------------- handler


def test_handler_fires_the_bucket_of_its_event_and_emits_metrics(
    spread_rig: Rig, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    timer = spread_rig.api.create(schedule=after(1))
    spread_rig.clock.advance(1_000)
    monkeypatch.setattr(trigger_app, "deps", lambda: spread_rig.deps())
    event = json.loads((EVENTS / "trigger.json").read_text())
    event["bucket"] = bucket_of(timer["id"], spread_rig.index.bucket_count)

    summary = trigger_app.handler(event, LambdaContext(function_name="trigger"))
    assert (summary["leased"], summary["enqueued"], summary["failed"]) == (1, 1, 0)
    emitted = [json.loads(line) for line in capsys.readouterr().out.splitlines() if "_aws" in line]
    (metrics,) = emitted
    counts = {name: metrics[name] for name in ("FiresEnqueued", "FireLag_on_time", "FireLag_gt_2s")}
    assert counts == {"FiresEnqueued": [1.0], "FireLag_on_time": [1.0], "FireLag_gt_2s": [0.0]}
    assert metrics["InvokeDelayMs"] == [1_000.0]  # the event's tick is T0, the run starts at T0+1s
    assert len(spread_rig.drain(spread_rig.api.queues["acme"])) == 1


@pytest.mark.parametrize("event", [{}, {"bucket": "7"}, {"bucket": -1}, {"bucket": True}])
def test_handler_rejects_an_event_without_a_bucket(event: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="bucket"):
        trigger_app.TriggerEvent.parse(event)

"""A third review, of the second one's fixes (the sandbox's usage writer, key list writes read
again, a keyed create's retry counting what it stored, the redrive queue's failed fires counted,
a redelivery's retry policy): each test is one defect it proved - a fire delayed or a count
lost - and fails if it comes back.

Fixtures and helpers: the trigger's rig (test_trigger.py), the delivery rig (test_webhooks.py),
the fan-out (test_fanout.py's shape), a FakeClock.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from botocore.exceptions import ClientError

from tests.integration.api_harness import SETTINGS
from tests.integration.test_trigger import (  # noqa: F401 - rig is a fixture
    REMAINING_MS,
    Rig,
    after,
    rig,
    until_armed,
)
from tests.integration.test_webhooks import Delivery, delivery  # noqa: F401
from tests.support.clock import T0, injected_clock_fanout
from timers.engine import keys
from timers.engine import trigger as trigger_module
from timers.engine.fanout import POLL_MS
from timers.engine.send import drain_usage
from timers.engine.trigger import Run, RunMarker, run_trigger
from timers.tenancy.usage import UsageCounters

pytestmark = pytest.mark.integration

GUARD_S = 10  # a real-time bound on waiting for the other thread: never reached when it works


# ---------------------------------------------------------------- the usage writer


def test_a_slow_usage_write_does_not_keep_the_fan_out_from_the_next_fire(
    rig: Rig,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The fan-out starts a run for bucket 0; it sends A (due T0+1 s) and, with nothing left
    within ARM_MS (B is due T0+1.6 s), stops. ``_stop`` hands back, then ``_counted`` waits for
    A's usage ADD - and only after it does ``run_trigger`` clear the marker. The ADD is
    throttled (botocore retries it for 1 s here). Meanwhile the fan-out polls every POLL_MS:
    B falls due within its lead at T0+1.45 s, but slot 0 is held by a run whose beat promise
    (T0+1.76 s) lapses for the fan-out only past BEAT_SKEW_MS, at T0+2.26 s. Nothing starts B's
    run before B is due: the counting the fix took off the fire's way is on the next fire's."""
    api, index = rig.api, rig.index
    api.create(schedule=after(1))
    api.create(schedule=after(1.6))
    until_armed(rig, T0 + 1_000)
    index.set_field(0, keys.SENTINEL, "ok")  # whole: nothing for the migrator to restore
    index.set_field(0, keys.RAN, rig.clock())  # warm: the fan-out leads it by LEAD_MS only
    real = UsageCounters(SETTINGS.claims_table, rig.log.client)
    invoked: list[int] = []

    def invoke(FunctionName: str, InvocationType: str, Payload: bytes) -> None:
        if FunctionName == SETTINGS.trigger_function_name:
            invoked.append(rig.clock())

    fanout = injected_clock_fanout(api.runtime.wiring, invoke, rig.clock, rig.sleep)
    stopping = threading.Event()  # the run is in its wait for its counts, or has unmarked
    real_wait, real_unmark = trigger_module.wait, Run.unmark

    def waiting(*args: Any, **kwargs: Any) -> Any:
        stopping.set()
        return real_wait(*args, **kwargs)

    def unmarked(self: Run) -> None:
        real_unmark(self)
        stopping.set()

    monkeypatch.setattr(trigger_module, "wait", waiting)
    monkeypatch.setattr(Run, "unmark", unmarked)

    class Throttled:
        def add(self, *args: Any, **kwargs: Any) -> None:
            assert stopping.wait(GUARD_S)
            for _ in range(10):  # a throttled UpdateItem: botocore retries it for 1 s
                rig.clock.advance(POLL_MS)
                fanout.act()
            real.add(*args, **kwargs)

    assert index.start_run(0, 0, "fan", 5_000)  # as the fan-out marks the slot it invokes
    report = run_trigger(rig.deps(usage=Throttled()), 0, REMAINING_MS, RunMarker(0, "fan"))
    drain_usage()
    assert report.enqueued == 1, report
    assert rig.clock() >= T0 + 2_000  # B is due: the fan-out had 5 polls to start its run
    assert invoked and invoked[0] <= T0 + 1_600, invoked  # was: [] (slot 0 still held)


# ---------------------------------------------------------------- the redrive queue's count


def test_a_redriven_fire_whose_dead_letter_failed_once_is_still_counted(
    delivery: Delivery,  # noqa: F811
) -> None:
    """``settle_redriven`` writes the record failed, then sends the dead letter, and only the
    Outcome it returns after that send says ``recorded``. An SQS error on that send leaves the
    message on the redrive queue; settled again, the record already says failed, so the
    outcome is not ``recorded`` and ``settle_batch`` counts nothing: the fire is failed in the
    history and the failed fires, and ``fires.failed`` stays 0 for good."""
    d = delivery
    d.deps.usage = UsageCounters(SETTINGS.claims_table)
    timer_id = d.fire(d.server.on("/crashes", 200))
    (m,) = d.receive()
    d.sqs.send_message(  # what SQS's redrive does after maxReceiveCount crashing receives
        QueueUrl=d.redrive, MessageBody=m["Body"], MessageAttributes=m["MessageAttributes"]
    )
    d.sqs.delete_message(QueueUrl=d.queue, ReceiptHandle=m["ReceiptHandle"])
    real = d.deps.dead_letter
    calls: list[int] = []

    def flaky(message: Any, reason: str) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("SQS: ServiceUnavailable")
        return real(message, reason)

    d.deps.dead_letter = flaky
    (first,) = d.receive(d.redrive)
    assert d.handle([first], redriven=True) == [first["MessageId"]]  # left on the queue
    d.sqs.change_message_visibility(
        QueueUrl=d.redrive, ReceiptHandle=first["ReceiptHandle"], VisibilityTimeout=0
    )
    (again,) = d.receive(d.redrive)
    assert d.handle([again], redriven=True) == []
    (fire,) = d.history(timer_id)
    assert fire["status"] == "failed", fire
    assert len(d.dead_letters()) == 1
    used = d.rig.api.call("GET", "/v1/tenant/usage").body
    assert used["fires"]["failed"] == 1, used  # was: 0


# ---------------------------------------------------------------- a keyed create's count


def test_a_keyed_batch_stored_in_part_then_finished_by_its_retry_counts_every_timer(
    rig: Rig,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``create_guarded`` stores a keyed batch timer by timer (a transaction each). A throttled
    transaction on the second timer fails the request (a 500) after the first was stored: the
    exception leaves ``store_new`` before it returns what it stored, so ``_create_once`` counts
    nothing. The retry (``_replay``) stores the second and counts what *it* stored: 1. Two
    timers created and active, the usage says 1 and 1 - and once both end, the trigger counts
    -2 active: the tenant's other active timers are under-counted from then on."""
    api = rig.api
    headers = {"Idempotency-Key": "batch-7"}
    body = {"timers": [{"schedule": after(3600)}, {"schedule": after(7200)}]}
    store = api.runtime.service.changes.timers
    real = store.transact
    calls: list[int] = []

    def throttled_second(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 2:
            raise ClientError(
                {"Error": {"Code": "ProvisionedThroughputExceededException", "Message": "slow"}},
                "TransactWriteItems",
            )
        return real(*args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(store, "transact", throttled_second)
        first = api.call("POST", "/v1/timers:batch", body=body, headers=headers)
        assert first.status == 500, first.body
    assert len(calls) == 2  # the first timer stored, the second's transaction refused
    again = api.call("POST", "/v1/timers:batch", body=body, headers=headers)
    assert again.status == 201, again.body
    ids = [t["id"] for t in again.body["items"]]
    assert all(api.call("GET", f"/v1/timers/{i}").status == 200 for i in ids)
    used = rig.usage()
    assert (used["timers_created"], used["active_timers"]) == (2, 2), used  # was: (1, 1)

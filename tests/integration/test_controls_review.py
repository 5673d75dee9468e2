"""An adversarial review of the tenant's controls: reset, run now, the retry policy, tenant keys
and usage. Each test is one defect the review proved - a timer lost, duplicated, delayed or
fired early, or the contract of reset / run now / retry broken (docs/fire-path.md, the API
contract's "Reset, run now, retry policy, keys, usage") - and fails if it comes back.

Fixtures and helpers: the trigger's rig (test_trigger.py), the api harness, a FakeClock.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

import boto3
import pytest

from tests.integration.api_harness import SETTINGS
from tests.integration.test_trigger import (  # noqa: F401 - rig is a fixture
    LAPSE_MS,
    REMAINING_MS,
    FlakyLog,
    Kill,
    RecordingSqs,
    Rig,
    after,
    kill_at,
    rig,
    until_armed,
)
from tests.integration.test_webhooks import DAY_MS, Delivery, delivery  # noqa: F401
from tests.support.clock import T0
from timers.core.times import format_ms
from timers.core.webhooks import Webhook
from timers.engine.send import drain_usage
from timers.engine.trigger import RunMarker, run_trigger
from timers.tenancy.usage import UsageCounters

pytestmark = pytest.mark.integration


def slow_run_now(on: Rig, meanwhile: Any, then_ms: int) -> None:
    """The next run now reads its timer, then ``meanwhile`` happens (another request: a change
    committed), then the run's clock reads ``then_ms`` (the request took that long) and it
    claims its position."""
    extras = on.api.runtime.service.extras
    assert extras is not None
    owner = extras.new_owner

    def new_owner() -> str:  # Extras.run: called after the timer was read, before the claim
        extras.new_owner = owner
        meanwhile()
        on.clock.now = then_ms
        return owner()

    extras.new_owner = new_owner


# ---------------------------------------------------------------- run now racing a change


def test_a_run_now_racing_a_schedule_change_never_ends_the_new_schedule(
    rig: Rig,  # noqa: F811
) -> None:
    """Run now picks its position against the timer it read (not an occurrence of *that*
    plan) and claims it unconditionally; a PATCH committed in between whose new schedule
    starts at that very millisecond leaves the chain's first position holding the extra fire's
    entry (``end``, n 0): the walk reads it as the chain's last fire, the timer completes, and
    every later occurrence of the new schedule is lost."""
    api = rig.api
    timer = api.create(schedule={"type": "every", "seconds": 7})  # 10:00:07, :14, ... :56, 01:03
    path = f"/v1/timers/{timer['id']}"
    rig.clock.now = T0 + 59_999

    def patch() -> None:
        cron = {"type": "cron", "expression": "* * * * *"}
        reply = api.call("PATCH", path, body={"schedule": cron})
        assert reply.status == 200, reply.body
        assert reply.body["next_fire_at"] == format_ms(T0 + 60_000)  # 10:01:00

    slow_run_now(rig, patch, then_ms=T0 + 60_001)  # 10:01:00 is surely reached
    ran = api.call("POST", f"{path}/run")
    assert ran.status == 202, ran.body
    # picked again against the new schedule: not its first position (10:01:00), just after it
    assert ran.body["fire_id"] == f"{timer['id']}:{T0 + 60_001}"
    for minute in (1, 2, 3):
        until_armed(rig, T0 + minute * 60_000)
        rig.run_until_idle()
    shown = rig.timer(timer["id"])
    assert (shown["status"], shown["next_fire_at"]) == ("active", format_ms(T0 + 240_000)), shown
    scheduled = sorted(s.scheduled for s in rig.sqs.sent)  # the trigger's sends
    assert scheduled[-2:] == [T0 + 120_000, T0 + 180_000]  # got: completed, fire_count 0


def test_a_timer_deleted_before_run_now_claims_is_never_sent_after_the_delete_answers(
    rig: Rig,  # noqa: F811
) -> None:
    """Changes win: a fire claimed before a change may still go (R5), but run now claims
    *after* the DELETE committed - nothing orders its claim with the change - and sends the
    deleted timer's payload after the 204."""
    api = rig.api
    timer = api.create(schedule={"type": "every", "seconds": 60}, payload="secret")
    path = f"/v1/timers/{timer['id']}"
    extras = api.runtime.service.extras
    assert extras is not None
    sqs = RecordingSqs(boto3.client("sqs"), rig.clock)
    extras.sqs = lambda: sqs
    rig.clock.now = T0 + 10_000
    deleted_at: list[int] = []

    def delete() -> None:
        assert api.call("DELETE", path).status == 204
        deleted_at.append(rig.clock())

    slow_run_now(rig, delete, then_ms=T0 + 10_001)
    ran = api.call("POST", f"{path}/run")
    assert api.call("GET", path).status == 404
    late = [s for s in sqs.sent if s.at >= deleted_at[0]]
    assert late == [], (ran.status, late)


# ---------------------------------------------------------------- run now: never early


def test_a_run_now_is_never_early_whatever_the_api_hosts_clock_says(
    rig: Rig,  # noqa: F811
) -> None:
    """The trigger never trusts its host's clock (test_never_early_whatever_the_host_clock_says:
    ±1.5 s); run now does: the position is the api host's now and it sends once that host's
    clock reached it. The api's clock is ``wall_clock_ms`` in production."""
    api = rig.api
    timer = api.create(schedule={"type": "every", "seconds": 60})
    extras = api.runtime.service.extras
    assert extras is not None
    sqs = RecordingSqs(boto3.client("sqs"), rig.clock)  # sends at the reference time
    extras.sqs = lambda: sqs
    extras.clock = lambda: rig.clock() + 300  # the api host's clock: 300 ms ahead
    rig.clock.now = T0 + 10_000
    ran = api.call("POST", f"/v1/timers/{timer['id']}/run")
    assert ran.status == 202, ran.body
    (sent,) = sqs.sent
    assert sent.at >= sent.scheduled, f"sent {sent.scheduled - sent.at} ms before its due time"


# ---------------------------------------------------------------- usage


@pytest.mark.parametrize("how", ["delete", "payload"])
def test_a_change_meeting_a_claimed_last_fire_leaves_no_phantom_active_timer(
    rig: Rig,  # noqa: F811
    how: str,
) -> None:
    """A change that adopts a claimed last fire starts from the timer *settled* (completed), so
    it counts no -1; the run then records the adopted entry at the change's revision, which it
    takes for "a change's: it counted itself" and counts no -1 either. The timer is gone (or
    completed) and the tenant's ``active_timers`` stays 1 for ever."""
    api = rig.api
    timer = api.create(schedule={"type": "after", "seconds": 1})
    path = f"/v1/timers/{timer['id']}"
    assert api.call("GET", "/v1/tenant/usage").body["active_timers"] == 1
    until_armed(rig, T0 + 1_000)
    changed: list[int] = []

    def hook(step: str) -> None:
        if step == "claimed" and not changed:
            reply = (
                api.call("DELETE", path)
                if how == "delete"
                else api.call("PATCH", path, body={"payload": "new"})
            )
            changed.append(reply.status)

    rig.run(hooks=hook)
    assert changed in ([204], [200])
    assert [s.scheduled for s in rig.sqs.sent] == [T0 + 1_000]  # the owed fire went
    if how == "payload":
        assert rig.timer(timer["id"])["status"] == "completed"
    used = api.call("GET", "/v1/tenant/usage").body
    assert used["fires"]["enqueued"] == 1
    assert sum(used["lag"].values()) == 1  # the adopted fire has its accuracy level too
    assert used["active_timers"] == 0


def test_a_timer_whose_chain_ends_on_a_skip_is_no_longer_counted_active(
    rig: Rig,  # noqa: F811
) -> None:
    """misfire ``skip``: a timer whose remaining occurrences all passed during an outage ends
    with a skipped entry (``k``, end). The run counts -1 active only for a chain that ended on
    a sent or failed fire, so the completed timer stays in ``active_timers``."""
    api = rig.api
    timer = api.create(
        schedule={"type": "every", "seconds": 1}, end_at=format_ms(T0 + 3_000), misfire="skip"
    )
    rig.clock.now = T0 + 60_000  # the service was down for a minute
    rig.run_until_idle()
    assert rig.sqs.sent == []  # skipped, as the policy says
    assert rig.timer(timer["id"])["status"] == "completed"
    assert api.call("GET", "/v1/tenant/usage").body["active_timers"] == 0


def test_a_record_whose_answer_was_lost_is_still_counted_in_usage(
    rig: Rig,  # noqa: F811
) -> None:
    """The contract: usage counts are exact for fires recorded by the service. The trigger
    counts what ``_write_back`` returns; a record applied by DynamoDB whose answer timed out
    is retried, the retry fails its condition (the entry is no longer a pending claim), the
    per-entry rewrite returns None ("taken over: re-sent") and the fire is left out - though
    it is recorded ``enqueued`` and nobody sends or counts it again."""
    api = rig.api
    timer = api.create(schedule={"type": "every", "seconds": 1})
    until_armed(rig, T0 + 1_000)
    rig.run(log=FlakyLog(rig.log, record=["applied"]))
    for k in (2, 3):
        until_armed(rig, T0 + k * 1_000)
        rig.run_until_idle()
    assert [s.scheduled for s in rig.sqs.sent] == [T0 + 1_000, T0 + 2_000, T0 + 3_000]
    assert [f["status"] for f in rig.fires(timer["id"])] == ["enqueued"] * 3
    used = api.call("GET", "/v1/tenant/usage").body
    assert used["fires"]["enqueued"] == 3  # got: 2
    assert sum(used["lag"].values()) == 3  # the rewritten record's level too


def test_a_fire_delivered_by_two_copies_of_its_message_is_counted_once(
    delivery: Delivery,  # noqa: F811
) -> None:
    """The fire path's duplicate window (a run killed after its send) puts an HTTP fire on the
    delivery queue twice. The consumer may get it twice (webhook-id dedupes), but the usage of
    the month counts each fire recorded once: here the copies meet in one batch, both pass
    ``check`` (nothing recorded yet), both POST, one delivery record wins - and both are
    counted delivered."""
    d = delivery
    d.deps.usage = UsageCounters(SETTINGS.claims_table)
    url = d.server.on("/twice", 200)
    made = d.rig.api.create(schedule=after(1), target={"url": url})
    d.rig.clock.now = T0 + 1_010
    with pytest.raises(Kill):
        d.rig.run(hooks=kill_at("sent"), delivery_queue_url=d.queue)
    d.rig.clock.advance(LAPSE_MS)
    d.rig.run_until_idle(delivery_queue_url=d.queue)  # the takeover sends it again
    copies = d.receive()
    copies += d.receive()
    assert len(copies) == 2
    assert d.handle(copies) == []
    (fire,) = d.history(made["id"])
    assert fire["status"] == "delivered"
    used = d.rig.api.call("GET", "/v1/tenant/usage").body
    assert used["fires"]["delivered"] == 1  # got: 2


def test_a_slow_usage_write_does_not_make_the_next_fires_late(
    rig: Rig,  # noqa: F811
) -> None:
    """Counting is not the fire path, yet ``Run._record`` called ``usage.add`` (a DynamoDB
    UpdateItem on one of 8 items per tenant and month - hot for a busy tenant, retried by
    botocore when throttled) before ``_finish`` chained the card and before the run's next
    send: a usage write that took 1 s made the fire due 100 ms after the first 900 ms late.
    Here the first fire's count is held until the second fire is sent: a run that waited for
    it would send the second only after the hold gave up (and count nothing)."""
    api = rig.api
    api.create(schedule={"type": "after", "seconds": 1})
    api.create(schedule={"type": "after", "seconds": 1.1})
    real = UsageCounters(SETTINGS.claims_table, rig.log.client)
    sent_before_count: list[int] = []

    class Throttled:
        def add(self, *args: Any, **kwargs: Any) -> None:
            deadline = time.monotonic() + 10  # a throttled UpdateItem and botocore's retries
            while len(rig.sqs.sent) < 2 and time.monotonic() < deadline:
                time.sleep(0.005)
            sent_before_count.append(len(rig.sqs.sent))
            real.add(*args, **kwargs)

    until_armed(rig, T0 + 1_000)
    rig.run_until_idle(usage=Throttled())
    lags = {s.scheduled - T0: s.at - s.scheduled for s in rig.sqs.sent}
    assert set(lags) == {1_000, 1_100}
    assert max(lags.values()) <= 100, lags
    assert sent_before_count and sent_before_count[0] == 2, sent_before_count  # was: 1
    assert api.call("GET", "/v1/tenant/usage").body["fires"]["enqueued"] == 2


def test_a_run_waiting_for_its_usage_writes_lets_the_bucket_start_again(
    rig: Rig,  # noqa: F811
) -> None:
    """A run waits for its usage writes when it stops; its run marker is cleared first, so
    the fan-out's next peek may start the bucket again for what fell due meanwhile - a slow
    counter write would otherwise hold the bucket until the marker's promise lapsed."""
    rig.api.create(schedule={"type": "every", "seconds": 10})
    rig.clock.now = T0 + 10_000
    assert rig.index.start_run(0, 0, "t", 5_000)
    real = UsageCounters(SETTINGS.claims_table, rig.log.client)
    free_while_counting: list[bool] = []

    class Slow:
        def add(self, *args: Any, **kwargs: Any) -> None:
            deadline = time.monotonic() + 5  # throttled, retried
            while time.monotonic() < deadline and not free_while_counting:
                if rig.index.start_run(0, 0, "next", 5_000):  # the fan-out's next start
                    free_while_counting.append(True)
                time.sleep(0.01)
            real.add(*args, **kwargs)

    run_trigger(rig.deps(usage=Slow()), 0, REMAINING_MS, RunMarker(0, "t"))
    drain_usage()
    assert free_while_counting == [True]  # was: the marker held until the write ended
    assert rig.usage()["fires"]["enqueued"] == 1


def test_a_slow_usage_write_does_not_delay_a_changed_timers_card(
    rig: Rig,  # noqa: F811
) -> None:
    """``Changes._attempt`` calls ``moved`` (``TimerService.status_moved``: a usage UpdateItem)
    after the transaction and before ``_sync``, the fast path that puts the timer's card in
    Redis. While that write is slow (throttled, retried) the trigger runs and finds nothing to
    lease; the reset timer's first fire, due meanwhile, goes out late (and, should the api time out
    in it, only when the migrator's next cycle lists it)."""
    api = rig.api
    timer = api.create(schedule={"type": "every", "seconds": 1})
    assert api.call("POST", f"/v1/timers/{timer['id']}/pause").status == 200
    usage = api.runtime.service.usage
    assert usage is not None
    real_add = usage.add

    def throttled(*args: Any, **kwargs: Any) -> None:
        until_armed(rig, T0 + 11_000)  # meanwhile the fan-out starts the bucket's run
        rig.run()
        rig.clock.now = T0 + 11_500  # a throttled UpdateItem and botocore's retries
        real_add(*args, **kwargs)

    rig.clock.now = T0 + 10_000
    usage.add = throttled  # type: ignore[method-assign]
    reset = api.call("POST", f"/v1/timers/{timer['id']}/reset")  # paused -> active: +1
    usage.add = real_add  # type: ignore[method-assign]
    assert reset.body["next_fire_at"] == format_ms(T0 + 11_000)
    rig.run_until_idle()
    (first, *_) = rig.sqs.sent
    assert first.scheduled == T0 + 11_000
    assert first.at - first.scheduled <= 100, first  # got: 500 ms late


# ---------------------------------------------------------------- keys


def test_a_revocation_whose_count_failed_is_still_refused_within_a_second(
    rig: Rig,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``revoke_key_id`` commits the key's delete, then bumps the revocation count (the one
    item every sandbox watches) in a second write. If that write fails (throttled - it is one
    item for every tenant - or the api dies), the request errs, its retry is a 404 (the key is
    off the list), the count never moves, and every sandbox that remembers the key keeps
    accepting it for AUTH_CACHE_MS (30 s)."""
    api = rig.api
    made = api.call("POST", "/v1/tenant/keys", body={"label": "leaked"})
    assert made.status == 201, made.body
    leaked, key_id = made.body["api_key"], made.body["key_id"]
    assert api.call("GET", "/v1/tenant", key=leaked).status == 200  # this sandbox remembers it
    store = api.runtime.tenants
    counted = store._count_revocation

    def throttled(*_: Any) -> None:
        raise RuntimeError("ProvisionedThroughputExceededException")

    monkeypatch.setattr(store, "_count_revocation", throttled)
    first = api.call("DELETE", f"/v1/tenant/keys/{key_id}")
    assert first.status >= 500, first.body
    monkeypatch.setattr(store, "_count_revocation", counted)
    again = api.call("DELETE", f"/v1/tenant/keys/{key_id}")  # the client retries
    assert again.status in (204, 404), again.body
    assert [k["key_id"] for k in api.call("GET", "/v1/tenant/keys").body["items"]] == [
        api.keys["acme"][:10]
    ]  # gone from the list: the tenant sees it revoked
    rig.clock.advance(1_001)
    assert api.call("GET", "/v1/tenant", key=leaked).status == 401  # got: 200 for 30 s


def test_a_revoked_key_read_once_from_a_stale_replica_is_not_trusted_for_30_s(
    rig: Rig,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``authenticate`` reads the key item without ``consistent_read``: just after a revoke a
    replica may still hold it. The sandbox had already read the new revocation count (a
    request with another key), so nothing makes it forget the key it now remembers: refused
    only after AUTH_CACHE_MS, not within 1 s. (The branch's ``_note_use`` even learns the key
    is gone - its conditional update of ``last_used_at`` fails - and ignores it.)"""
    api = rig.api
    store = api.runtime.tenants
    made = api.call("POST", "/v1/tenant/keys", body={})
    leaked, key_id = made.body["api_key"], made.body["key_id"]
    model = store.models.api_key
    stale = model.get(f"KEY#{hashlib.sha256(leaked.encode()).hexdigest()}")
    rig.clock.advance(1_500)
    store.revoke_key_id("acme", key_id)  # DELETE, answered 204 by another sandbox
    rig.clock.advance(200)
    assert api.call("GET", "/v1/tenant").status == 200  # another key: this sandbox sees it
    rig.clock.advance(300)
    real_get = model.get

    def replica(pk: str, *args: Any, **kwargs: Any) -> Any:
        if pk == stale.pk and not kwargs.get("consistent_read"):
            return stale  # a replica that has not seen the delete yet (0.5 s after it)
        return real_get(pk, *args, **kwargs)

    monkeypatch.setattr(model, "get", replica)
    assert api.call("GET", "/v1/tenant", key=leaked).status == 401  # no replica is asked
    monkeypatch.setattr(model, "get", real_get)  # every replica caught up
    rig.clock.advance(1_500)  # 2 s after the revocation
    assert api.call("GET", "/v1/tenant", key=leaked).status == 401  # was: 200 for 30 s


# ---------------------------------------------------------------- retry policy


def test_a_retry_policy_without_max_age_still_fails_a_fire_a_day_after_it_was_due(
    delivery: Delivery,  # noqa: F811
) -> None:
    """The contract's default max_age_seconds is 86400 after the fire was due. A policy giving
    only ``max_attempts`` ages from the *first attempt* (RetryPolicy.spent): a fire that never
    got a slot (its tenant's cap on the origin held) has none, so ``no_slot`` defers it for
    ever - without a policy the same fire fails a day after its due time."""
    d = delivery
    url = d.server.on("/busy", 200)
    origin = Webhook(url).origin
    held = [d.slots.acquire("acme", origin, d.rig.clock()) for _ in range(8)]
    assert all(held)
    timer_id = d.fire(url, retry={"max_attempts": 5})
    assert d.handle(d.receive()) == []  # no slot: deferred (a fresh copy)
    (fire,) = d.history(timer_id)
    assert (fire["status"], fire["attempts"]) == ("enqueued", 0)
    d.rig.clock.advance(DAY_MS + 1_000)  # a day after the fire was due; the cap still held
    now = d.rig.clock()
    held += [d.slots.acquire("acme", origin, now) for _ in range(8)]
    assert d.slots.acquire("acme", origin, now) is None
    assert d.handle(d.receive()) == []
    (fire,) = d.history(timer_id)
    assert fire["status"] == "failed", fire  # got: deferred again, for ever
    assert d.server.received == []

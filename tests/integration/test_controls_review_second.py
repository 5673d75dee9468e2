"""A second adversarial review of the tenant's controls (reset, run now, retry policy, keys,
usage): each test is one defect it proved - a count, a key or a policy that broke
docs/fire-path.md or the API contract's "Reset, run now, retry policy, keys, usage" - and
fails if it comes back.

Fixtures and helpers: the trigger's rig (test_trigger.py), the delivery rig (test_webhooks.py),
a FakeClock.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.api_harness import SETTINGS
from tests.integration.test_trigger import (  # noqa: F401 - rig is a fixture
    LAPSE_MS,
    Kill,
    Rig,
    after,
    rig,
    until_armed,
)
from tests.integration.test_webhooks import Delivery, delivery  # noqa: F401
from tests.support.clock import T0
from timers.tenancy.usage import UsageCounters

pytestmark = pytest.mark.integration


class Died(Exception):
    """The api's request fails here (its Lambda errs: a 500, the client retries)."""


# ---------------------------------------------------------------- usage


def test_a_keyed_create_finished_by_its_retry_is_counted_in_usage(
    rig: Rig,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first request with an Idempotency-Key records the key, then dies before its timers
    are stored (a 500). Its retry finds the key pending and ``_replay`` stores the timers - but
    only ``create`` / ``_create_once`` count ``timers_created`` and ``active``: the replay
    counts nothing. The timer is created and active, the usage says 0 and 0; once its last
    fire is recorded the trigger counts -1 active, so the tenant's other active timers are
    under-counted from then on."""
    api = rig.api
    other = api.create(schedule={"type": "every", "seconds": 3600})  # stays active
    headers = {"Idempotency-Key": "order-9"}
    body = {"schedule": after(1)}
    changes = api.runtime.service.changes
    with monkeypatch.context() as patch:

        def dies(*_: Any, **__: Any) -> None:
            raise Died("the api's request failed before its timers were stored")

        patch.setattr(changes, "store_new", dies)
        assert api.call("POST", "/v1/timers", body=body, headers=headers).status == 500
    again = api.call("POST", "/v1/timers", body=body, headers=headers)
    assert again.status == 201, again.body
    assert api.call("GET", f"/v1/timers/{again.body['id']}").status == 200  # it exists
    until_armed(rig, T0 + 1_000)
    rig.run_until_idle()
    assert rig.timer(again.body["id"])["status"] == "completed"
    assert rig.timer(other["id"])["status"] == "active"
    used = rig.usage()
    assert used["timers_created"] == 2, used  # was: 1
    assert used["active_timers"] == 1, used  # was: 0 (1 + 0 - 1: the replayed timer's end)


# ---------------------------------------------------------------- keys


def test_a_key_revoked_while_another_sandbox_looks_it_up_is_never_listed_again(
    rig: Rig,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``authenticate`` reads the key's item, then the tenant's item; ``_note_use`` then adds
    the key to the tenant's list if it is missing ("a key from before the list"), conditional
    only on the list being unchanged since that read. A revocation committed between the two
    reads removed the key from the list: the lookup puts it back (its ``last_used_ms`` update,
    conditional on the key existing, is skipped when the key was used within a minute). The
    list now names a key that no longer exists, so ``revoke_key_id`` counts two keys and lets
    the tenant revoke its last working one (the contract: revoking its last key is a 409)."""
    api = rig.api
    store = api.runtime.tenants
    first = api.keys["acme"]  # the tenant's key (listed)
    made = api.call("POST", "/v1/tenant/keys", body={"label": "ci"})
    assert made.status == 201, made.body
    second, second_id = made.body["api_key"], made.body["key_id"]
    assert api.call("GET", "/v1/tenant", key=second).status == 200  # used: last_used_at set
    rig.clock.advance(5_000)
    model = store.models.api_key
    real_get = model.get
    revoked: list[int] = []

    def get(pk: str, *args: Any, **kwargs: Any) -> Any:
        item = real_get(pk, *args, **kwargs)
        if pk == item.pk and item.key_id == second_id and not revoked:
            # meanwhile, in another sandbox: DELETE /v1/tenant/keys/<second>
            revoked.append(api.call("DELETE", f"/v1/tenant/keys/{second_id}").status)
        return item

    monkeypatch.setattr(model, "get", get)
    assert store.authenticate(second) is not None  # another sandbox's lookup, racing it
    monkeypatch.setattr(model, "get", real_get)
    assert revoked == [204]
    rig.clock.advance(1_001)
    assert api.call("GET", "/v1/tenant", key=second).status == 401  # revoked indeed
    # The tenant now has one working key. Revoking it must be refused.
    first_id = first[:10]
    last = api.call("DELETE", f"/v1/tenant/keys/{first_id}")
    assert last.status == 409, (last.status, last.body)  # was: 204 - no working key is left


def test_a_fire_failed_dead_lettered_by_the_redrive_queue_is_counted_in_usage(
    delivery: Delivery,  # noqa: F811
) -> None:
    """An HTTP fire whose delivery kept crashing goes to the redrive queue; ``settle_redriven``
    records it failed (``dead_lettered``) and lists it in the failed fires - but only
    ``deliver_batch`` counts usage (``_count``), ``settle_batch`` does not. The fire is
    recorded failed in the month and ``fires.failed`` stays 0 (the contract: counts are exact
    for fires recorded by the service)."""
    d = delivery
    d.deps.usage = UsageCounters(SETTINGS.claims_table)
    timer_id = d.fire(d.server.on("/crashes", 200))
    (m,) = d.receive()
    d.sqs.send_message(  # what SQS's redrive does after maxReceiveCount crashing receives
        QueueUrl=d.redrive, MessageBody=m["Body"], MessageAttributes=m["MessageAttributes"]
    )
    d.sqs.delete_message(QueueUrl=d.queue, ReceiptHandle=m["ReceiptHandle"])
    assert d.handle(d.receive(d.redrive), redriven=True) == []
    (fire,) = d.history(timer_id)
    assert fire["status"] == "failed", fire
    used = d.rig.api.call("GET", "/v1/tenant/usage").body
    assert used["fires"]["failed"] == 1, used  # was: 0


# ---------------------------------------------------------------- retry policy


def test_a_redelivered_fire_is_retried_as_the_timers_retry_policy_now_says(
    delivery: Delivery,  # noqa: F811
) -> None:
    """``_redeliver`` sends the failed message again with the timer's *current* target ("the
    user may have fixed the URL"), but keeps the ``retry`` attribute of the failed message. A
    fire that failed at ``max_attempts: 1``, whose timer the user PATCHed to ``max_attempts:
    3`` (the contract: PATCH may change it; the response echoes it) before redelivering, still
    fails after one POST of the redelivery."""
    d, server = delivery, delivery.server
    url = server.on("/flaky", 503)
    timer_id = d.fire(url, retry={"max_attempts": 1})
    assert d.handle(d.receive()) == []  # one 503: failed at max_attempts 1
    (fire,) = d.history(timer_id)
    assert (fire["status"], fire["attempts"]) == ("failed", 1)
    patched = d.rig.api.call("PATCH", f"/v1/timers/{timer_id}", body={"retry": {"max_attempts": 3}})
    assert patched.status == 200 and patched.body["retry"]["max_attempts"] == 3, patched.body
    assert d.redeliver(timer_id, fire["fire_id"]).status == 202
    messages = d.receive()
    failed = d.handle(messages)  # the redelivery's first POST: 503 again
    (fire,) = d.history(timer_id)
    assert fire["attempts"] == 2
    assert fire["status"] == "enqueued", fire  # was: failed (max_attempts of the old policy)
    assert failed == [messages[0]["MessageId"]]  # retried: 2 POSTs of its 3 are left


def test_two_keys_created_at_once_are_both_created(
    rig: Rig,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``create_key`` (and ``revoke_key_id``) read the tenant's key list and write it back on
    condition it is unchanged, but never read it again: a second request that changed the list
    meanwhile makes the first a 409 ``concurrent_update`` - a code the contract does not give
    these routes - though the tenant keeps 2 of its 10 keys. (A lookup that lists a key from
    before the list, ``_note_use``, changes it too.)"""
    api = rig.api
    store = api.runtime.tenants
    real = store._get_item
    answers: list[Any] = []

    def get_item(name: str) -> Any:
        item = real(name)
        if not answers:  # another request creates a key meanwhile
            answers.append(None)
            answers[0] = api.call("POST", "/v1/tenant/keys", body={"label": "b"})
        return item

    monkeypatch.setattr(store, "_get_item", get_item)
    first = api.call("POST", "/v1/tenant/keys", body={"label": "a"})
    monkeypatch.setattr(store, "_get_item", real)
    assert answers[0].status == 201, answers[0].body
    assert first.status == 201, first.body  # was: 409 concurrent_update


def test_a_run_killed_after_it_recorded_fires_still_counts_them(
    rig: Rig,  # noqa: F811
) -> None:
    """The trigger keeps what it recorded in ``Run.counted`` and adds it to usage only when the
    run stops (``_stop``); a run that dies counts nothing. So the window in which a kill (a
    Lambda timeout, OOM, host loss) loses counts is no longer "between a record and its count"
    but the whole run - up to its 30 s and every fire recorded in it. Here the run records the
    first fire, goes on, and dies at its next claim: the first fire is recorded ``enqueued``,
    nobody sends or counts it again, and the month's ``enqueued`` misses it (its timer, completed,
    also stays in ``active_timers``)."""
    api = rig.api
    one = api.create(schedule=after(1))
    api.create(schedule=after(1.25))
    until_armed(rig, T0 + 1_000)
    claims: list[str] = []

    def hook(step: str) -> None:
        if step == "claimed":
            claims.append(step)
            if len(claims) == 2:  # the second fire's claim, after the first's record
                raise Kill(step)

    with pytest.raises(Kill):
        rig.run(hooks=hook)
    assert [s.scheduled for s in rig.sqs.sent] == [T0 + 1_000]
    assert [f["status"] for f in rig.fires(one["id"])] == ["enqueued"]  # recorded
    rig.clock.advance(LAPSE_MS)
    rig.run_until_idle()  # the second fire is taken over and sent; the first is not again
    assert sorted(s.scheduled for s in rig.sqs.sent) == [T0 + 1_000, T0 + 1_250]
    used = rig.usage()
    assert used["fires"]["enqueued"] == 2, used  # was: 1
    assert used["lag"]["1-200ms"] == 1 and sum(used["lag"].values()) == 2, used  # one taken over

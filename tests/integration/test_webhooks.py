"""HTTP targets end to end: api -> trigger -> delivery queue -> delivery function -> a real HTTP
server on 127.0.0.1, with moto (DynamoDB, SQS) and a real redis-server; time injected.

The delivery function's handler runs as Lambda's SQS event source would call it (an SQS event of
the received messages); a retry is observed as the message's batch item failure and its new
visibility timeout, then "time passes" by making the message visible again.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import Any

import boto3
import pytest
import standardwebhooks

from functions.delivery import app as delivery_app
from ops import template
from ops.local.context import LambdaContext
from ops.local.queues import sqs_event
from ops.local.spec import QueueSourceSpec
from tests.integration.api_harness import SETTINGS
from tests.integration.test_trigger import (  # noqa: F401 - rig is a fixture
    LAPSE_MS,
    Kill,
    Rig,
    after,
    kill_at,
    rig,
    until_armed,
)
from tests.support.clock import T0
from tests.support.webhook_server import WebhookServer, webhook_server
from timers import service as service_module
from timers.adapters import http_target, tenants
from timers.adapters.target_slots import TargetSlots
from timers.core.webhooks import Attempt, Webhook
from timers.delivery import DeliveryDeps, dead_letter_body

pytestmark = pytest.mark.integration

DAY_MS = 86_400_000


class Delivery:
    """The delivery queue, its DLQ and the delivery function's handler, wired to the rig."""

    def __init__(
        self, the_rig: Rig, server: WebhookServer, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        self.rig, self.server = the_rig, server
        self.sqs = boto3.client("sqs")
        template.create_queues(self.sqs)
        self.queue = self.sqs.get_queue_url(QueueName="DeliveryQueue")["QueueUrl"]
        self.dlq = self.sqs.get_queue_url(QueueName="DeliveryDeadLetterQueue")["QueueUrl"]
        self.timeout_s = 5.0
        self.wall_clock = False  # sign with the real time (standardwebhooks checks it)
        the_rig.api.runtime.service.allow_loopback_targets = True

        def post(url: str, body: bytes, headers: Mapping[str, str]) -> Attempt:
            return http_target.post(
                url, body, headers, allow_loopback=True, timeout_s=self.timeout_s
            )

        def clock() -> int:
            return time.time_ns() // 1_000_000 if self.wall_clock else the_rig.clock()

        self.deps = DeliveryDeps(
            records=the_rig.claims,
            slots=TargetSlots(SETTINGS.claims_table, 8, boto3.client("dynamodb")),
            secrets=lambda tenant: tenants.signing_secrets(tenant, the_rig.clock()),
            post=post,
            dead_letter=lambda m, reason: self.sqs.send_message(
                QueueUrl=self.dlq, **dead_letter_body(m, reason)
            ),
            clock=clock,
            jitter=lambda: 0.0,
        )
        settings = replace(SETTINGS, delivery_queue_url=self.queue)
        monkeypatch.setattr(delivery_app, "deps", lambda: self.deps)
        monkeypatch.setattr(delivery_app, "settings", lambda: settings)
        monkeypatch.setattr(delivery_app, "sqs", lambda: self.sqs)
        self.source = QueueSourceSpec(
            "DeliveryFunction", "DeliveryFunction.Deliveries", self.queue,
            "arn:aws:sqs:us-east-1:123456789012:DeliveryQueue", 10, 0, True, None,
        )  # fmt: skip

    def fire(self, url: str, headers: dict[str, str] | None = None, **timer: Any) -> str:
        """Create a timer on ``url`` due at T0 + 1 s and let the trigger fire it."""
        target: dict[str, Any] = {"url": url, **({"headers": headers} if headers else {})}
        made = self.rig.api.create(schedule=after(1), target=target, **timer)
        until_armed(self.rig, T0 + 1_000)
        (report,) = self.rig.run(delivery_queue_url=self.queue)
        assert report.enqueued == 1, report
        return str(made["id"])

    def receive(self) -> list[dict[str, Any]]:
        got = self.sqs.receive_message(
            QueueUrl=self.queue,
            MaxNumberOfMessages=10,
            AttributeNames=["All"],
            MessageAttributeNames=["All"],
        )
        return list(got.get("Messages", []))

    def handle(self, messages: list[dict[str, Any]]) -> list[str]:
        """Run the handler on these messages; delete what it did not report failed, as the
        event source does. Returns the failed message ids."""
        event = sqs_event(messages, self.source, "us-east-1")
        response = delivery_app.handler(event, LambdaContext(function_name="delivery"))
        failed = [f["itemIdentifier"] for f in response.get("batchItemFailures", [])]
        done = [m for m in messages if m["MessageId"] not in failed]
        for m in done:
            self.sqs.delete_message(QueueUrl=self.queue, ReceiptHandle=m["ReceiptHandle"])
        return failed

    def make_visible(self, messages: list[dict[str, Any]]) -> None:
        """The backoff has passed."""
        for m in messages:
            self.sqs.change_message_visibility(
                QueueUrl=self.queue, ReceiptHandle=m["ReceiptHandle"], VisibilityTimeout=0
            )

    def dead_letters(self) -> list[dict[str, Any]]:
        got = self.sqs.receive_message(
            QueueUrl=self.dlq, MaxNumberOfMessages=10, MessageAttributeNames=["All"]
        )
        return list(got.get("Messages", []))

    def history(self, timer_id: str) -> list[dict[str, Any]]:
        return self.rig.fires(timer_id)


@pytest.fixture
def delivery(rig: Rig, monkeypatch: pytest.MonkeyPatch) -> Iterator[Delivery]:  # noqa: F811
    with webhook_server() as server:
        yield Delivery(rig, server, monkeypatch)


def test_a_fire_is_posted_signed_with_the_contract_body_and_shown_delivered(
    delivery: Delivery,
) -> None:
    d, server = delivery, delivery.server
    d.wall_clock = True
    url = server.on("/hook", 200)
    payload = {"order": 42, "note": "grüße", "n": [1.5, None]}
    timer_id = d.fire(url, {"Authorization": "Bearer abc"}, payload=payload, name="r")
    history = d.history(timer_id)
    assert history[0]["status"] == "enqueued" and history[0]["attempts"] == 0

    messages = d.receive()
    assert len(messages) == 1
    assert d.handle(messages) == []
    (request,) = server.at("/hook")
    secret = d.rig.api.call("GET", "/v1/tenant").body["webhook_secret"]
    assert secret.startswith("whsec_")
    body = standardwebhooks.Webhook(secret).verify(request.body, request.headers)
    assert body["fire_id"] == f"{timer_id}:{T0 + 1_000}" == request.headers["webhook-id"]
    assert body["payload"] == payload and body["tenant"] == "acme" and body["name"] == "r"
    assert request.headers["authorization"] == "Bearer abc"
    assert request.headers["content-type"] == "application/json"

    (fire,) = d.history(timer_id)
    assert (fire["status"], fire["attempts"], fire["last_status"]) == ("enqueued", 1, 200)
    assert fire["delivered_at"] is not None and fire["reason"] is None
    assert d.receive() == []  # deleted


def test_a_500_is_retried_with_backoff_then_delivered(delivery: Delivery) -> None:
    d, server = delivery, delivery.server
    timer_id = d.fire(server.on("/flaky", 500, 503, 200))
    for attempt in (1, 2):
        messages = d.receive()
        assert [m["MessageId"] for m in messages] == d.handle(messages)  # back on the queue
        assert d.receive() == []  # invisible for the backoff
        (fire,) = d.history(timer_id)
        assert (fire["attempts"], fire["last_status"], fire["delivered_at"]) == (
            attempt,
            500 if attempt == 1 else 503,
            None,
        )
        assert fire["status"] == "enqueued"
        d.rig.clock.advance(60_000)
        d.make_visible(messages)
    assert d.handle(d.receive()) == []
    (fire,) = d.history(timer_id)
    assert (fire["attempts"], fire["last_status"]) == (3, 200)
    assert fire["delivered_at"] is not None
    assert len(server.at("/flaky")) == 3
    assert d.dead_letters() == []


def test_a_400_fails_at_once_and_goes_to_the_dead_letter_queue(delivery: Delivery) -> None:
    d, server = delivery, delivery.server
    timer_id = d.fire(server.on("/gone", 400))
    assert d.handle(d.receive()) == []
    (fire,) = d.history(timer_id)
    assert (fire["status"], fire["attempts"], fire["last_status"]) == ("failed", 1, 400)
    assert "400" in fire["reason"] and fire["delivered_at"] is None
    (dead,) = d.dead_letters()
    assert dead["MessageAttributes"]["reason"]["StringValue"] == "http 400"
    assert json.loads(dead["Body"])["fire_id"] == f"{timer_id}:{T0 + 1_000}"
    assert len(server.at("/gone")) == 1
    assert d.receive() == []


def test_a_timeout_is_retried(delivery: Delivery) -> None:
    d, server = delivery, delivery.server
    d.timeout_s = 0.3
    timer_id = d.fire(server.on("/hang", 200, hold=threading.Event()))
    messages = d.receive()
    assert d.handle(messages) == [messages[0]["MessageId"]]
    (fire,) = d.history(timer_id)
    assert (fire["status"], fire["attempts"], fire["last_status"]) == ("enqueued", 1, None)


def test_after_the_retry_budget_the_fire_fails_and_is_dead_lettered(delivery: Delivery) -> None:
    d, server = delivery, delivery.server
    timer_id = d.fire(server.on("/down", 503))
    messages = d.receive()
    assert d.handle(messages) != []
    d.rig.clock.advance(DAY_MS)  # the first attempt is now 24 h old
    d.make_visible(messages)
    assert d.handle(d.receive()) == []  # given up: deleted from the delivery queue
    (fire,) = d.history(timer_id)
    assert (fire["status"], fire["attempts"], fire["last_status"]) == ("failed", 2, 503)
    assert fire["reason"] == "gave up after 2 attempts: http 503"
    (dead,) = d.dead_letters()
    assert dead["MessageAttributes"]["reason"]["StringValue"] == fire["reason"]
    assert d.receive() == []


@pytest.mark.parametrize(
    "url",
    [
        "https://169.254.169.254/latest/meta-data/",
        "https://10.0.0.1/hook",
        "https://192.168.1.10/hook",
        "https://[fd00:ec2::254]/latest",
        "https://[64:ff9b::a9fe:a9fe]/latest/meta-data/",  # NAT64 of the metadata endpoint
    ],
)
def test_private_and_metadata_addresses_are_refused_at_delivery(
    delivery: Delivery, url: str
) -> None:
    d = delivery
    timer_id = d.fire(url)
    assert d.handle(d.receive()) == []
    (fire,) = d.history(timer_id)
    assert (fire["status"], fire["reason"], fire["last_status"]) == (
        "failed",
        "blocked_address",
        None,
    )
    (dead,) = d.dead_letters()
    assert dead["MessageAttributes"]["reason"]["StringValue"] == "blocked_address"


@pytest.mark.parametrize(
    "address",
    [
        "64:ff9b::a9fe:a9fe",  # NAT64 of 169.254.169.254
        "64:ff9b::7f00:1",  # NAT64 of 127.0.0.1: refused though the rig allows loopback
        "64:ff9b:1::a00:1",  # local-use NAT64
        "2002:a9fe:a9fe::1",  # 6to4 of 169.254.169.254
        "::a9fe:a9fe",  # IPv4-compatible
        "fec0::1",  # site-local
    ],
)
def test_a_name_resolving_to_an_ipv6_form_of_a_private_address_is_refused_at_delivery(
    delivery: Delivery, monkeypatch: pytest.MonkeyPatch, address: str
) -> None:
    d = delivery
    asked: list[str] = []

    def resolve(host: str, port: int) -> list[str]:
        asked.append(host)
        return [address]

    monkeypatch.setattr(http_target, "resolve", resolve)
    timer_id = d.fire("https://hooks.example.com/x")  # public-looking: valid at create
    assert d.handle(d.receive()) == []
    assert asked == ["hooks.example.com"]
    (fire,) = d.history(timer_id)
    assert (fire["status"], fire["reason"], fire["attempts"]) == ("failed", "blocked_address", 1)


def test_one_tenants_slow_endpoint_does_not_delay_anothers(delivery: Delivery) -> None:
    d, server = delivery, delivery.server
    fast_seen = threading.Event()
    slow = server.on("/slow", 200, hold=fast_seen)
    fast = server.on("/fast", 200)
    d.rig.api.create(schedule=after(1), target={"url": slow})
    d.rig.api.create("globex", schedule=after(1), target={"url": fast})
    until_armed(d.rig, T0 + 1_000)
    (report,) = d.rig.run(delivery_queue_url=d.queue)
    assert report.enqueued == 2
    original = d.deps.post

    def post(url: str, body: bytes, headers: Mapping[str, str]) -> Attempt:
        got = original(url, body, headers)
        if url == fast:
            fast_seen.set()
        return got

    d.deps.post = post
    messages = d.receive()
    assert len(messages) == 2
    assert d.handle(messages) == []
    # /slow answered only once /fast had its answer (or after its 30 s hold, which fails this)
    assert fast_seen.is_set()


def test_a_url_target_is_validated_at_create_and_patch_and_changes_nothing(
    delivery: Delivery,
) -> None:
    api = delivery.rig.api
    api.runtime.service.allow_loopback_targets = False
    bad = [
        ({"url": "http://example.com/x"}, "target.url"),
        ({"url": "https://u:p@example.com/x"}, "target.url"),
        ({"url": "https://example.com/" + "x" * 2_050}, "target.url"),
        ({"url": "http://127.0.0.1:9/x"}, "target.url"),  # loopback needs the setting
        ({"url": "https://example.com/x", "headers": {"webhook-id": "1"}}, "target.headers"),
        ({"url": "https://example.com/x", "queue_url": api.queues["acme"]}, "target"),
    ]
    for target, field in bad:
        reply = api.call("POST", "/v1/timers", body={"schedule": after(60), "target": target})
        assert (reply.status, reply.error_code) == (400, "validation_error"), target
        assert any(f.startswith(field) for f in reply.error_fields), (target, reply.body)
    listed = api.call("GET", "/v1/timers").body["items"]
    assert listed == []

    made = api.create(schedule=after(60), target={"url": "https://example.com/h"})
    assert made["target"] == {"url": "https://example.com/h", "headers": {}}
    reply = api.call(
        "PATCH", f"/v1/timers/{made['id']}", body={"target": {"url": "http://example.com/h"}}
    )
    assert (reply.status, reply.error_code) == (400, "validation_error")
    assert api.call("GET", f"/v1/timers/{made['id']}").body["target"] == made["target"]
    reply = api.call(
        "PATCH",
        f"/v1/timers/{made['id']}",
        body={"target": {"url": "https://example.org/n", "headers": {"X-A": "1"}}},
    )
    assert reply.status == 200
    assert reply.body["target"] == {"url": "https://example.org/n", "headers": {"X-A": "1"}}
    back = api.call("PATCH", f"/v1/timers/{made['id']}", body={"target": None})
    assert back.body["target"] == {"queue_url": api.queues["acme"]}


def test_an_unsendable_target_is_a_400_on_its_field_at_create_and_patch_and_changes_nothing(
    rig: Rig,  # noqa: F811
) -> None:
    """What http.client would refuse at send time (and the old checks let through) is refused
    with the contract's error body, naming the field."""
    api = rig.api
    bad = [
        ({"url": "https://example.com/x", "headers": {"X-Foo": "v\n"}}, "target.headers.X-Foo"),
        ({"url": "https://example.com/x", "headers": {"X-Foo\n": "v"}}, "target.headers.X-Foo\n"),
        ({"url": "https://example.com/gr\u00fc\u00dfe"}, "target.url"),
        ({"url": "https://2130706433/x"}, "target.url"),  # 127.0.0.1 to inet_aton
    ]
    made = api.create(
        schedule=after(60), target={"url": "https://example.com/h", "headers": {"X-Foo": "v"}}
    )
    for target, field in bad:
        for method, path in (("POST", "/v1/timers"), ("PATCH", f"/v1/timers/{made['id']}")):
            reply = api.call(method, path, body={"schedule": after(60), "target": target})
            assert reply.status == 400, (method, target, reply.body)
            error = reply.body["error"]
            assert error["code"] == "validation_error" and isinstance(error["message"], str)
            assert [d["field"] for d in error["details"]] == [field], (method, error)
    (only,) = api.call("GET", "/v1/timers").body["items"]
    assert only["id"] == made["id"]
    assert api.call("GET", f"/v1/timers/{made['id']}").body == made


def test_a_target_stored_before_validation_caught_it_fails_at_once(
    delivery: Delivery, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A header ending in a newline, as the old header check let through: the first attempt
    fails ``invalid_target`` without sending anything, and it is not retried."""
    d, server = delivery, delivery.server

    def unchecked(url: str, headers: dict[str, str], allow_loopback: bool) -> Any:
        return Webhook(url, tuple(headers.items())), []

    monkeypatch.setattr(service_module, "validate_target", unchecked)
    timer_id = d.fire(server.on("/ok"), headers={"X-Foo": "v\n"})
    assert d.handle(d.receive()) == []  # not a batch item failure: no retry
    (fire,) = d.history(timer_id)
    assert (fire["status"], fire["reason"], fire["attempts"]) == ("failed", "invalid_target", 1)
    (dead,) = d.dead_letters()
    assert dead["MessageAttributes"]["reason"]["StringValue"] == "invalid_target"
    assert server.received == [] and d.receive() == []


def test_a_rotated_secret_and_the_old_one_both_sign_during_the_window(
    delivery: Delivery,
) -> None:
    d, server = delivery, delivery.server
    d.wall_clock = True
    old = d.rig.api.call("GET", "/v1/tenant").body["webhook_secret"]
    rotated = tenants.rotate_secret("acme", d.rig.clock(), window_ms=3_600_000)
    assert rotated.webhook_secret != old
    d.fire(server.on("/hook", 200))
    d.handle(d.receive())
    (request,) = server.at("/hook")
    assert len(request.headers["webhook-signature"].split(" ")) == 2
    for secret in (old, rotated.webhook_secret):
        assert secret is not None
        standardwebhooks.Webhook(secret).verify(request.body, request.headers)
    # after the window only the new one signs
    assert tenants.signing_secrets("acme", d.rig.clock() + 3_600_001) == [rotated.webhook_secret]


@pytest.mark.parametrize("step", ["claimed", "sent", "recorded"])
def test_a_trigger_killed_around_the_send_still_posts_each_fire_once(
    delivery: Delivery, step: str
) -> None:
    """The fire path's duplicate window (killed after the send, before the record) puts the
    fire on the delivery queue twice; the delivery record lets only the first one POST."""
    d, server = delivery, delivery.server
    url = server.on("/once", 200)
    made = d.rig.api.create(schedule=after(1), target={"url": url})
    d.rig.clock.now = T0 + 1_010
    with pytest.raises(Kill):
        d.rig.run(hooks=kill_at(step), delivery_queue_url=d.queue)
    if step != "claimed":  # it was sent: deliver that copy now
        assert d.handle(d.receive()) == []
    d.rig.clock.advance(LAPSE_MS)
    d.rig.run_until_idle(delivery_queue_url=d.queue)
    while messages := d.receive():
        assert d.handle(messages) == []
    assert len(server.at("/once")) == 1
    (fire,) = d.history(made["id"])
    assert (fire["status"], fire["attempts"], fire["last_status"]) == ("enqueued", 1, 200)

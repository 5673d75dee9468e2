"""HTTP targets end to end: api -> trigger -> delivery queue -> delivery function -> a real HTTP
server on 127.0.0.1, with moto (DynamoDB, SQS) and a real redis-server; time injected.

The delivery function's handler runs as Lambda's SQS event source would call it (an SQS event of
the received messages); a retry is observed as the message's batch item failure and its new
visibility timeout, then "time passes" by making the message visible again. A deferral's
re-sent copy is recorded with its delay and sent visible at once (its delay has passed).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
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
from tests.support.serialized import one_call_at_a_time
from tests.support.webhook_server import WebhookServer, webhook_server
from timers.api import creating
from timers.core.times import format_ms
from timers.core.webhook_attempts import Attempt
from timers.core.webhooks import Webhook
from timers.delivery import http_target
from timers.delivery.batches import deliver_batch
from timers.delivery.decisions import DeliveryDeps
from timers.delivery.failed_fires import DeliveryQueue, FailedFireStore
from timers.delivery.messages import (
    DEAD_LETTERED,
    DEFER_MAX_S,
    Message,
    dead_letter_body,
    requeue_body,
)
from timers.delivery.target_slots import TargetSlots

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
        self.redrive = self.sqs.get_queue_url(QueueName="DeliveryRedriveQueue")["QueueUrl"]
        self.delays: list[int] = []  # of each deferral's re-sent copy
        self.timeout_s = 5.0
        self.wall_clock = False  # sign with the real time (standardwebhooks checks it)
        the_rig.api.runtime.service.allow_loopback_targets = True

        def post(url: str, body: bytes, headers: Mapping[str, str]) -> Attempt:
            return http_target.post(
                url, body, headers, allow_loopback=True, timeout_s=self.timeout_s
            )

        def clock() -> int:
            return time.time_ns() // 1_000_000 if self.wall_clock else the_rig.clock()

        def requeue(message: Message, delay_s: int) -> None:
            self.delays.append(delay_s)
            body = {**requeue_body(message, delay_s), "DelaySeconds": 0}
            self.sqs.send_message(QueueUrl=self.queue, **body)

        # Concurrent batches take slots of one counter item at once (see one_call_at_a_time).
        dynamodb = one_call_at_a_time(boto3.client("dynamodb"))
        self.slots = TargetSlots(SETTINGS.claims_table, 8, 16, dynamodb)
        self.deps = DeliveryDeps(
            records=the_rig.api.runtime.service.deliveries,
            slots=self.slots,
            secrets=lambda tenant: the_rig.api.tenants.signing_secrets(tenant, the_rig.clock()),
            post=post,
            dead_letter=lambda m, reason: self.sqs.send_message(
                QueueUrl=self.dlq, **dead_letter_body(m, reason)
            ),
            requeue=requeue,
            failed_fires=FailedFireStore(
                SETTINGS.failed_fires_table, SETTINGS.fire_retention_days, dynamodb
            ),
            clock=clock,
            jitter=lambda: 0.0,
        )
        # The api redelivers to this delivery queue.
        the_rig.api.runtime.failures.delivery_queue = DeliveryQueue(self.queue, self.sqs)
        settings = replace(
            SETTINGS, delivery_queue_url=self.queue, delivery_redrive_queue_url=self.redrive
        )
        monkeypatch.setattr(delivery_app, "deps", lambda: self.deps)
        monkeypatch.setattr(delivery_app, "settings", lambda: settings)
        monkeypatch.setattr(delivery_app, "sqs", lambda: self.sqs)
        self.source = QueueSourceSpec(
            "DeliveryFunction", "DeliveryFunction.Deliveries", self.queue,
            "arn:aws:sqs:us-east-1:123456789012:DeliveryQueue", 10, 0, True, None,
        )  # fmt: skip
        self.redriven = QueueSourceSpec(
            "DeliveryFunction", "DeliveryFunction.Redriven", self.redrive,
            "arn:aws:sqs:us-east-1:123456789012:DeliveryRedriveQueue", 10, 0, True, 2,
        )  # fmt: skip

    def fire(self, url: str, headers: dict[str, str] | None = None, **timer: Any) -> str:
        """Create a timer on ``url`` due at T0 + 1 s and let the trigger fire it."""
        target: dict[str, Any] = {"url": url, **({"headers": headers} if headers else {})}
        made = self.rig.api.create(schedule=after(1), target=target, **timer)
        until_armed(self.rig, T0 + 1_000)
        (report,) = self.rig.run(delivery_queue_url=self.queue)
        assert report.enqueued == 1, report
        return str(made["id"])

    def receive(self, queue: str | None = None) -> list[dict[str, Any]]:
        got = self.sqs.receive_message(
            QueueUrl=queue or self.queue,
            MaxNumberOfMessages=10,
            AttributeNames=["All"],
            MessageAttributeNames=["All"],
        )
        return list(got.get("Messages", []))

    def handle(self, messages: list[dict[str, Any]], redriven: bool = False) -> list[str]:
        """Run the handler on these messages (of the delivery queue, or of the redrive queue);
        delete what it did not report failed, as the event source does. Returns the failed
        message ids."""
        source = self.redriven if redriven else self.source
        event = sqs_event(messages, source, "us-east-1")
        response = delivery_app.handler(event, LambdaContext(function_name="delivery"))
        failed = [f["itemIdentifier"] for f in response.get("batchItemFailures", [])]
        done = [m for m in messages if m["MessageId"] not in failed]
        for m in done:
            self.sqs.delete_message(QueueUrl=source.queue_url, ReceiptHandle=m["ReceiptHandle"])
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

    def history(self, timer_id: str, tenant: str = "acme") -> list[dict[str, Any]]:
        return self.rig.fires(timer_id, tenant)

    def failed(self, tenant: str = "acme", **query: str) -> list[dict[str, Any]]:
        """GET /v1/fires?status=failed (and ``query``): the items of its one page."""
        reply = self.rig.api.call(
            "GET", "/v1/fires", tenant=tenant, query={"status": "failed", **query}
        )
        assert reply.status == 200, reply.body
        assert reply.body["next_cursor"] is None
        return list(reply.body["items"])

    def redeliver(self, timer_id: str, fire_id: str, tenant: str = "acme") -> Any:
        return self.rig.api.call(
            "POST", f"/v1/timers/{timer_id}/fires/{fire_id}/redeliver", tenant=tenant
        )


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
    assert history[0]["last_error"] is None  # no attempt yet

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
    assert (fire["status"], fire["attempts"], fire["last_status"]) == ("delivered", 1, 200)
    assert fire["delivered_at"] is not None and fire["reason"] is None
    last = fire["last_error"]
    assert (last["status"], last["error"], last["body"]) == (200, None, "ok")
    assert isinstance(last["latency_ms"], int) and last["latency_ms"] >= 0
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


def test_a_failed_fire_keeps_the_start_of_the_answer_and_never_the_request_headers(
    delivery: Delivery,
) -> None:
    d, server = delivery, delivery.server
    answer = ("é" * 300).encode() + b"tail"  # 604 bytes; 512 of them are 256 é
    url = server.on("/refuses", 422, body=answer)
    timer_id = d.fire(url, {"Authorization": "Bearer s3cret"})
    assert d.handle(d.receive()) == []
    (fire,) = d.history(timer_id)
    last = fire["last_error"]
    assert (fire["status"], last["status"], last["error"]) == ("failed", 422, None)
    assert last["body"] == "é" * 256  # the first 512 bytes, as text
    stored = d.rig.api.runtime.wiring.log.client.scan(TableName=SETTINGS.claims_table)["Items"]
    assert "s3cret" not in json.dumps(stored)  # the request's headers are not kept


def test_a_retry_policy_ends_the_fire_failed_at_max_attempts_with_no_further_post(
    delivery: Delivery,
) -> None:
    d, server = delivery, delivery.server
    url = server.on("/down", 503)
    timer_id = d.fire(url, retry={"max_attempts": 2})
    messages = d.receive()
    policy = json.loads(messages[0]["MessageAttributes"]["retry"]["StringValue"])
    assert policy == {"max_attempts": 2, "max_age_seconds": None}
    assert d.handle(messages) == [messages[0]["MessageId"]]  # the first 503: retried
    d.make_visible(messages)
    assert d.handle(d.receive()) == []  # the second: the last one allowed, failed
    (fire,) = d.history(timer_id)
    assert (fire["status"], fire["attempts"]) == ("failed", 2)
    assert fire["reason"] == "gave up after 2 attempts (max_attempts): http 503"
    assert fire["last_error"]["status"] == 503
    assert len(server.at("/down")) == 2 and d.receive() == []
    assert len(d.dead_letters()) == 1


def test_run_now_of_an_http_target_is_posted_by_the_delivery_function(
    delivery: Delivery,
) -> None:
    d, server = delivery, delivery.server
    url = server.on("/now", 200)
    made = d.rig.api.create(schedule=after(3_600), target={"url": url})
    extras = d.rig.api.runtime.service.extras
    assert extras is not None
    extras.delivery_queue_url = d.queue
    reply = d.rig.api.call("POST", f"/v1/timers/{made['id']}/run")
    assert reply.status == 202, reply.body
    assert (reply.body["status"], reply.body["attempts"]) == ("enqueued", 0)
    assert d.handle(d.receive()) == []
    (posted,) = server.at("/now")
    assert posted.headers["webhook-id"] == reply.body["fire_id"]
    (fire,) = d.history(made["id"])
    assert (fire["fire_id"], fire["status"]) == (reply.body["fire_id"], "delivered")


def test_a_timeout_is_retried(delivery: Delivery) -> None:
    d, server = delivery, delivery.server
    d.timeout_s = 0.3
    timer_id = d.fire(server.on("/hang", 200, hold=threading.Event()))
    messages = d.receive()
    assert d.handle(messages) == [messages[0]["MessageId"]]
    (fire,) = d.history(timer_id)
    assert (fire["status"], fire["attempts"], fire["last_status"]) == ("enqueued", 1, None)
    last = fire["last_error"]
    assert (last["status"], last["error"], last["body"]) == (None, "timeout", "")
    assert last["latency_ms"] >= 300  # the attempt's timeout, 0.3 s here


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
    "address",
    [
        "169.254.169.254",  # the metadata endpoint
        "10.0.0.1",
        "192.168.1.10",
        "fd00:ec2::254",
        "64:ff9b::a9fe:a9fe",  # NAT64 of the metadata endpoint
    ],
)
def test_names_of_private_and_metadata_addresses_are_refused_at_delivery(
    delivery: Delivery, monkeypatch: pytest.MonkeyPatch, address: str
) -> None:
    """A literal is refused at create (test_api.py); a name is judged where it resolves."""
    d = delivery
    monkeypatch.setattr(http_target, "resolve", lambda host, port: [address])
    timer_id = d.fire("https://inside.example.com/hook")
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


def max_receives() -> int:
    """The delivery queue's maxReceiveCount: the receive that would move a message to the
    redrive queue."""
    queue = template.resources("AWS::SQS::Queue")["DeliveryQueue"]
    return int(queue["RedrivePolicy"]["maxReceiveCount"])


def fire_all(d: Delivery, timers: list[tuple[str, str]]) -> tuple[list[str], list[Message]]:
    """Create a timer per (tenant, url), due at T0 + 1 s, fire them, and receive every message."""
    ids = [
        str(d.rig.api.create(tenant, schedule=after(1), target={"url": url})["id"])
        for tenant, url in timers
    ]
    until_armed(d.rig, T0 + 1_000)
    (report,) = d.rig.run(delivery_queue_url=d.queue)
    assert report.enqueued == len(timers)
    got: list[dict[str, Any]] = []
    while len(got) < len(timers) and (more := d.receive()):
        got += more
    assert len(got) == len(timers)
    order = {timer_id: i for i, timer_id in enumerate(ids)}
    return ids, sorted(
        (Message.from_record(sqs_event([m], d.source, "us-east-1")["Records"][0]) for m in got),
        key=lambda m: order[m.attributes["fire_id"].rpartition(":")[0]],
    )


def as_received(m: Message) -> dict[str, Any]:
    """A message back in receive_message's shape, for Delivery.handle."""
    return {
        "MessageId": m.message_id,
        "ReceiptHandle": m.receipt_handle,
        "Body": m.body,
        "MessageAttributes": {
            k: {"DataType": "String", "StringValue": v} for k, v in m.attributes.items()
        },
    }


def test_a_tenant_saturating_an_origin_does_not_defer_anothers_messages_to_it(
    delivery: Delivery,
) -> None:
    """acme holds 8 slow POSTs to an origin globex uses too: globex's fire to it is POSTed at
    once; only acme's own 9th waits (sent again with a delay, no attempt counted)."""
    d, server = delivery, delivery.server
    release = threading.Event()
    slow = server.on("/acme-slow", 200, hold=release)
    fast = server.on("/globex", 200)  # the same origin: 127.0.0.1:<port>
    ids, messages = fire_all(d, [("acme", slow)] * 9 + [("globex", fast)])
    acme, globex = messages[:9], messages[9]

    # Another sandbox POSTs acme's first 8: they hold the tenant's slots for that origin.
    with ThreadPoolExecutor(1) as sandbox:
        busy = sandbox.submit(deliver_batch, acme[:8], d.deps)
        assert server.wait_for("/acme-slow", 8)
        assert d.handle([as_received(globex), as_received(acme[8])]) == []
        assert len(server.at("/globex")) == 1  # not deferred behind acme's POSTs
        assert len(server.at("/acme-slow")) == 8 and d.delays == [1]  # acme's 9th deferred
        (fire,) = d.history(ids[9], "globex")
        assert fire["delivered_at"] is not None and fire["attempts"] == 1
        (fire,) = d.history(ids[8])
        assert (fire["status"], fire["attempts"]) == ("enqueued", 0)
        release.set()
        assert busy.result().count("delivered") == 8
    for m in acme[:8]:
        d.sqs.delete_message(QueueUrl=d.queue, ReceiptHandle=m.receipt_handle)
    (again,) = d.receive()  # the deferred copy, back after its delay
    assert again["MessageAttributes"]["deferrals"]["StringValue"] == "1"
    assert d.handle([again]) == []
    assert len(server.at("/acme-slow")) == 9
    assert d.receive() == [] and d.dead_letters() == []


def test_a_tenants_cap_holds_across_its_origins_and_each_tenant_has_its_own(
    delivery: Delivery,
) -> None:
    """Slow POSTs to 16 subdomains of one domain fill acme's cap across origins: its 17th
    origin waits, while globex's webhooks - to those same origins too - go on."""
    d, server, slots, now = delivery, delivery.server, delivery.slots, delivery.rig.clock()
    evil = [f"https://s{i}.evil.example" for i in range(17)]
    held = [slots.acquire("acme", origin, now) for origin in evil[:16]]
    assert all(held)
    assert slots.acquire("acme", evil[16], now) is None  # the tenant's cap, not the origin's
    pair, _ = TargetSlots.keys("acme", evil[16], now)
    got = slots.client.get_item(TableName=SETTINGS.claims_table, Key={"k": {"S": pair}})
    assert got["Item"]["inflight"]["N"] == "0"  # the origin's slot was given back
    other = [slots.acquire("globex", origin, now) for origin in evil[8:]]  # 9 of them
    assert all(other)
    for keys in other:
        slots.release(keys)

    # Through the delivery function: acme's fire waits, globex's to the same origin is POSTed.
    ids, messages = fire_all(d, [("acme", server.on("/a")), ("globex", server.on("/b"))])
    assert d.handle([as_received(m) for m in messages]) == []
    assert (len(server.at("/a")), len(server.at("/b")), d.delays) == (0, 1, [1])
    assert d.history(ids[0])[0]["attempts"] == 0
    assert d.history(ids[1], "globex")[0]["delivered_at"] is not None
    slots.release(held[0])
    assert d.handle(d.receive()) == []  # a slot of acme's is free again
    assert len(server.at("/a")) == 1


def test_the_cap_per_tenant_and_origin(delivery: Delivery) -> None:
    slots, now = delivery.slots, delivery.rig.clock()
    origin = "https://shared.example"
    taken = [slots.acquire("acme", origin, now) for _ in range(9)]
    assert all(taken[:8]) and taken[8] is None
    assert slots.acquire("acme", "https://other.example", now) is not None
    assert slots.acquire("globex", origin, now) is not None
    slots.release(taken[0])
    assert slots.acquire("acme", origin, now) is not None


def inflight(slots: TargetSlots, key: str) -> int:
    got = slots.client.get_item(TableName=SETTINGS.claims_table, Key={"k": {"S": key}})
    return int(got.get("Item", {}).get("inflight", {}).get("N", "0"))


def test_slots_taken_together_get_what_is_left_of_each_cap(delivery: Delivery) -> None:
    """Wanting 5 where the origin's cap has 3 left takes 3; where the tenant's cap has less
    left than the origin's, the origin's extra is given back; a release gives all back."""
    slots, now = delivery.slots, delivery.rig.clock()
    a, b, c = (f"https://{name}.example" for name in "abc")
    first = slots.acquire("acme", a, now, want=5)
    assert first is not None and first.count == 5
    second = slots.acquire("acme", a, now, want=5)  # the origin's cap: 8
    assert second is not None and second.count == 3
    assert slots.acquire("acme", a, now, want=5) is None
    third = slots.acquire("acme", b, now, want=6)
    assert third is not None and third.count == 6
    fourth = slots.acquire("acme", c, now, want=5)  # the tenant's cap (16) has 2 left
    assert fourth is not None and fourth.count == 2
    counters = [
        *TargetSlots.keys("acme", a, now),
        *(TargetSlots.keys("acme", o, now)[0] for o in (b, c)),
    ]
    assert [inflight(slots, key) for key in counters] == [8, 16, 6, 2]
    for held in (first, second, third, fourth):
        slots.release(held)
    assert [inflight(slots, key) for key in counters] == [0, 0, 0, 0]


def test_a_batch_shares_the_free_slots_of_an_origin_and_defers_the_rest(
    delivery: Delivery,
) -> None:
    """Another sandbox holds 5 of acme's 8 slots for an origin: a batch of 10 to it takes the
    3 left in one write, POSTs at most 3 at once, each slot serving two messages in turn; the
    other 4 are deferred. The slots are given back when its last POST is done."""
    d, server = delivery, delivery.server
    hold = threading.Event()
    url = server.on("/busy", 200, hold=hold)
    ids, messages = fire_all(d, [("acme", url)] * 10)
    now = d.rig.clock()
    elsewhere = d.slots.acquire("acme", Webhook(url).origin, now, want=5)
    assert elsewhere is not None and elsewhere.count == 5
    pair, whole = TargetSlots.keys("acme", Webhook(url).origin, now)
    with ThreadPoolExecutor(1) as sandbox:
        batch = sandbox.submit(d.handle, [as_received(m) for m in messages])
        assert server.wait_for("/busy", 3)
        # A 4th POST waits for one of these 3 to finish: none can while they are held.
        assert len(server.at("/busy")) == 3 and inflight(d.slots, pair) == 8
        hold.set()
        assert batch.result() == []
    assert len(server.at("/busy")) == 6 and len(d.delays) == 4
    assert (inflight(d.slots, pair), inflight(d.slots, whole)) == (5, 5)
    delivered = [f for i in ids for f in d.history(i) if f["delivered_at"] is not None]
    assert len(delivered) == 6
    d.slots.release(elsewhere)


def test_deferrals_do_not_walk_a_message_toward_the_dead_letter_queue(
    delivery: Delivery,
) -> None:
    """A message deferred more times than the queue's maxReceiveCount is never moved off the
    queue: each deferral is a fresh message (receive count 1), and its delay grows."""
    d, server = delivery, delivery.server
    url = server.on("/busy", 200)
    now = d.rig.clock()
    held = [d.slots.acquire("acme", Webhook(url).origin, now) for _ in range(8)]
    assert all(held)
    timer_id = d.fire(url)
    for _ in range(max_receives() + 1):
        (m,) = d.receive()
        assert m["Attributes"]["ApproximateReceiveCount"] == "1"
        assert d.handle([m]) == []
    assert d.delays[:6] == [1, 2, 4, 8, 16, 32] and max(d.delays) == DEFER_MAX_S // 2
    assert d.receive(d.redrive) == [] and d.dead_letters() == []
    (fire,) = d.history(timer_id)
    assert (fire["status"], fire["attempts"]) == ("enqueued", 0)
    assert server.received == []
    for keys in held:
        d.slots.release(keys)
    assert d.handle(d.receive()) == []
    (fire,) = d.history(timer_id)
    assert (fire["attempts"], fire["last_status"]) == (1, 200)
    assert fire["delivered_at"] is not None


def test_a_message_sqs_dead_letters_ends_failed_with_its_reason_in_the_fire_history(
    delivery: Delivery,
) -> None:
    """The function keeps failing on a message until SQS moves it (maxReceiveCount) to the
    redrive queue; settling it there fails the fire (dead_lettered) and passes the message on
    to the dead-letter queue with that reason."""
    d = delivery
    timer_id = d.fire(d.server.on("/x", 200))

    def crash(url: str, body: bytes, headers: Mapping[str, str]) -> Attempt:
        raise RuntimeError("the sandbox died")

    d.deps.post = crash
    receives = 0
    while messages := d.receive():
        assert d.handle(messages) == [m["MessageId"] for m in messages]
        d.make_visible(messages)
        receives += 1
    assert receives == max_receives()
    (fire,) = d.history(timer_id)
    assert fire["status"] == "enqueued"  # nothing recorded why yet
    moved = d.receive(d.redrive)
    assert len(moved) == 1
    assert d.handle(moved, redriven=True) == []
    (fire,) = d.history(timer_id)
    assert (fire["status"], fire["reason"], fire["attempts"]) == ("failed", DEAD_LETTERED, 0)
    (dead,) = d.dead_letters()
    assert dead["MessageAttributes"]["reason"]["StringValue"] == DEAD_LETTERED
    assert json.loads(dead["Body"])["fire_id"] == f"{timer_id}:{T0 + 1_000}"
    assert d.receive(d.redrive) == [] and d.receive() == []


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
    assert reply.body["target"] == {"url": "https://example.org/n", "headers": {"X-A": "********"}}
    back = api.call("PATCH", f"/v1/timers/{made['id']}", body={"target": None})
    assert back.body["target"] == {"queue_url": api.queues["acme"]}


SECRET_TOKEN = "Bearer sk_live_do-not-show-me"


def test_header_values_are_masked_in_every_answer_and_kept_for_delivery(
    delivery: Delivery, caplog: pytest.LogCaptureFixture
) -> None:
    """A webhook's header values (a token, typically) are given once: every answer shows the
    names with the values masked, the endpoint still gets them, and a PATCH that omits them (or
    gives a value as the mask) keeps them - on the same origin only."""
    d, server, api = delivery, delivery.server, delivery.rig.api
    first, second = server.on("/first", 200), server.on("/second", 200)
    token = {"Authorization": SECRET_TOKEN}
    made = api.create(schedule=after(1), name="hooked", target={"url": first, "headers": token})
    shown = {"url": first, "headers": {"Authorization": "********"}}
    assert made["target"] == shown
    assert api.call("GET", f"/v1/timers/{made['id']}").body["target"] == shown
    assert [t["target"] for t in api.call("GET", "/v1/timers").body["items"]] == [shown]
    other = {"schedule": after(3600), "target": {"url": first, "headers": {"X-Key": "k1"}}}
    batch = api.call("POST", "/v1/timers:batch", body={"timers": [other]})
    assert batch.body["items"][0]["target"]["headers"] == {"X-Key": "********"}

    # PATCH without headers: the stored value stays, and is what the endpoint gets.
    moved = api.call("PATCH", f"/v1/timers/{made['id']}", body={"target": {"url": second}})
    assert moved.status == 200, moved.body
    assert moved.body["target"] == {"url": second, "headers": {"Authorization": "********"}}
    # A header given as the mask keeps its value too; another header is added in clear.
    masked = {"url": second, "headers": {"Authorization": "********", "X-Extra": "e"}}
    again = api.call("PATCH", f"/v1/timers/{made['id']}", body={"target": masked})
    assert again.body["target"]["headers"] == {"Authorization": "********", "X-Extra": "********"}
    until_armed(d.rig, T0 + 1_000)
    (report,) = d.rig.run(delivery_queue_url=d.queue)
    assert report.enqueued == 1
    assert d.handle(d.receive()) == []
    (request,) = server.at("/second")
    assert (request.headers["authorization"], request.headers["x-extra"]) == (SECRET_TOKEN, "e")

    # Values never go to another origin unless given again; a mask with nothing behind it is
    # refused; a new timer cannot be made of a mask.
    elsewhere = {"url": "https://elsewhere.example.com/h"}
    for target in (elsewhere, {**elsewhere, "headers": {"Authorization": "********"}}):
        reply = api.call("PATCH", f"/v1/timers/{made['id']}", body={"target": target})
        assert (reply.status, reply.error_fields) == (400, {"target.headers"}), reply.body
    unknown = {"url": second, "headers": {"X-Never": "********"}}
    reply = api.call("PATCH", f"/v1/timers/{made['id']}", body={"target": unknown})
    assert (reply.status, reply.error_fields) == (400, {"target.headers.X-Never"})
    reply = api.call("POST", "/v1/timers", body={"schedule": after(60), "target": unknown})
    assert (reply.status, reply.error_fields) == (400, {"target.headers.X-Never"})
    given = {**elsewhere, "headers": {"Authorization": "Bearer other"}}
    assert api.call("PATCH", f"/v1/timers/{made['id']}", body={"target": given}).status == 200
    assert SECRET_TOKEN not in json.dumps([vars(r) for r in caplog.records], default=repr)


def test_a_delivery_error_quoting_a_header_value_logs_where_not_what(
    delivery: Delivery, caplog: pytest.LogCaptureFixture
) -> None:
    d = delivery
    timer_id = d.fire(d.server.on("/h", 200), headers={"Authorization": SECRET_TOKEN})

    def post(url: str, body: bytes, headers: Mapping[str, str]) -> Attempt:
        raise ValueError(f"cannot send {headers['Authorization']}")

    d.deps.post = post
    (message,) = d.receive()
    assert d.handle([message]) == [message["MessageId"]]  # left on the queue, to come back
    [logged] = [r for r in caplog.records if r.getMessage() == "delivery failed"]
    assert logged.error == "ValueError" and any("in post" in f for f in logged.trace)
    assert SECRET_TOKEN not in json.dumps([vars(r) for r in caplog.records], default=repr)
    (fire,) = d.history(timer_id)
    assert fire["status"] == "enqueued"


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

    def unchecked(url: str, headers: dict[str, str], *_: bool) -> Any:  # allow_loopback, ...
        return Webhook(url, tuple(headers.items())), []

    monkeypatch.setattr(creating, "validate_target", unchecked)
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
    rotated = d.rig.api.tenants.rotate_secret("acme", d.rig.clock(), window_ms=3_600_000)
    assert rotated.webhook_secret != old
    d.fire(server.on("/hook", 200))
    d.handle(d.receive())
    (request,) = server.at("/hook")
    assert len(request.headers["webhook-signature"].split(" ")) == 2
    for secret in (old, rotated.webhook_secret):
        assert secret is not None
        standardwebhooks.Webhook(secret).verify(request.body, request.headers)
    # after the window only the new one signs
    after = d.rig.api.tenants.signing_secrets("acme", d.rig.clock() + 3_600_001)
    assert after == [rotated.webhook_secret]


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
    assert (fire["status"], fire["attempts"], fire["last_status"]) == ("delivered", 1, 200)


# ---------------------------------------------------------------- failed fires, redelivered


def test_a_failed_fire_is_listed_and_once_its_endpoint_is_fixed_redelivered_with_its_id(
    delivery: Delivery,
) -> None:
    d, server = delivery, delivery.server
    d.wall_clock = True  # (signatures are checked against the real time)
    url = server.on("/fixed-later", 400, 200)
    timer_id = d.fire(url, name="invoice", payload={"n": 1})
    fire_id = f"{timer_id}:{T0 + 1_000}"
    assert d.failed() == []
    assert d.handle(d.receive()) == []
    (failed,) = d.failed()
    assert failed == {
        "fire_id": fire_id,
        "timer_id": timer_id,
        "name": "invoice",
        "due_at": "2026-11-21T10:00:01.000Z",
        "failed_at": failed["failed_at"],
        "reason": "http 400",
        "last_status": 400,
        "attempts": 1,
        "redelivered_at": None,
    }
    d.dead_letters()  # (the DLQ keeps its copy: redelivery does not need it)

    reply = d.redeliver(timer_id, fire_id)
    assert reply.status == 202, reply.body
    assert reply.body == {**failed, "redelivered_at": reply.body["redelivered_at"]}
    assert reply.body["redelivered_at"] is not None
    (fire,) = d.history(timer_id)
    assert (fire["status"], fire["reason"], fire["attempts"]) == ("enqueued", None, 1)
    assert (fire["last_status"], fire["delivered_at"]) == (400, None)

    again = d.receive()
    assert len(again) == 1
    assert d.handle(again) == []
    first, second = server.at("/fixed-later")
    assert first.headers["webhook-id"] == second.headers["webhook-id"] == fire_id
    assert first.body == second.body  # the very callback that failed
    secret = d.rig.api.call("GET", "/v1/tenant").body["webhook_secret"]
    standardwebhooks.Webhook(secret).verify(second.body, second.headers)
    (fire,) = d.history(timer_id)
    assert (fire["status"], fire["attempts"], fire["last_status"]) == ("delivered", 2, 200)
    assert fire["delivered_at"] is not None
    assert d.failed() == []  # a failure no more: left out of the list ...
    assert d.failed(include_redelivered="true") == [reply.body]  # ... unless asked for

    # Delivered now: neither it nor "all of the timer's" redelivers anything.
    for path in (f"/v1/timers/{timer_id}/fires/{fire_id}/redeliver",
                 f"/v1/timers/{timer_id}/fires:redeliver"):  # fmt: skip
        reply = d.rig.api.call("POST", path)
        if path.endswith(":redeliver"):
            assert (reply.status, reply.body) == (202, {"items": []})
        else:
            assert (reply.status, reply.error_code) == (409, "invalid_state"), reply.body
    assert d.receive() == []


def test_a_delivered_or_redelivered_fire_is_not_redelivered_409(delivery: Delivery) -> None:
    d, server = delivery, delivery.server
    ok = d.fire(server.on("/ok", 200))
    assert d.handle(d.receive()) == []
    reply = d.redeliver(ok, f"{ok}:{T0 + 1_000}")
    assert (reply.status, reply.error_code) == (409, "invalid_state")
    assert "delivered" in reply.body["error"]["message"]

    d.rig.clock.now = T0  # a second timer due at T0 + 1 s
    gone = d.fire(server.on("/gone", 400))
    fire_id = f"{gone}:{T0 + 1_000}"
    assert d.handle(d.receive()) == []
    assert d.redeliver(gone, fire_id).status == 202
    reply = d.redeliver(gone, fire_id)  # redelivered, not failed again
    assert (reply.status, reply.error_code) == (409, "invalid_state")
    assert len(d.receive()) == 1  # one redelivered message, not two
    assert d.receive() == []


def test_another_tenants_failed_fire_is_not_listed_and_not_found(delivery: Delivery) -> None:
    d, server = delivery, delivery.server
    timer_id = d.fire(server.on("/gone", 400))
    fire_id = f"{timer_id}:{T0 + 1_000}"
    assert d.handle(d.receive()) == []
    assert [f["fire_id"] for f in d.failed()] == [fire_id]
    assert d.failed("globex") == []
    for path in (f"/v1/timers/{timer_id}/fires/{fire_id}/redeliver",
                 f"/v1/timers/{timer_id}/fires:redeliver"):  # fmt: skip
        reply = d.rig.api.call("POST", path, tenant="globex")
        assert (reply.status, reply.error_code) == (404, "not_found"), path
    for fire in (f"{timer_id}:{T0 + 2_000}", f"{timer_id}:x", f"tmr_other:{T0 + 1_000}",
                 f"{timer_id}:{'9' * 3_000}"):  # fmt: skip
        reply = d.redeliver(timer_id, fire)
        assert (reply.status, reply.error_code) == (404, "not_found"), fire
    assert d.receive() == []
    (fire,) = d.history(timer_id)
    assert fire["status"] == "failed"  # nothing changed


def test_a_dead_lettered_fire_is_listed_and_can_be_redelivered(delivery: Delivery) -> None:
    """A message SQS moved off the delivery queue (maxReceiveCount: the function kept
    crashing on it) fails dead_lettered when the redrive queue's batch settles it."""
    d, server = delivery, delivery.server
    timer_id = d.fire(server.on("/later", 200), headers={"X-Token": "old"})
    (m,) = d.receive()
    d.sqs.send_message(  # what SQS's redrive does, without the 100 crashing receives
        QueueUrl=d.redrive,
        MessageBody=m["Body"],
        MessageAttributes=m["MessageAttributes"],
    )
    d.sqs.delete_message(QueueUrl=d.queue, ReceiptHandle=m["ReceiptHandle"])
    assert d.handle(d.receive(d.redrive), redriven=True) == []
    (failed,) = d.failed()
    assert (failed["reason"], failed["attempts"], failed["last_status"]) == (
        DEAD_LETTERED,
        0,
        None,
    )
    # The target as the timer has it now: a URL or token fixed meanwhile takes effect.
    fixed = {"url": server.on("/fixed", 200), "headers": {"X-Token": "new"}}
    assert d.rig.api.call("PATCH", f"/v1/timers/{timer_id}", body={"target": fixed}).status == 200
    assert d.redeliver(timer_id, failed["fire_id"]).status == 202
    assert d.handle(d.receive()) == []
    (fire,) = d.history(timer_id)
    assert (fire["attempts"], fire["last_status"]) == (1, 200)
    assert fire["delivered_at"] is not None
    assert server.at("/later") == []
    (request,) = server.at("/fixed")
    assert request.headers["x-token"] == "new" and request.body.decode() == m["Body"]


def test_failed_fires_are_filtered_by_time_and_paged_newest_first(delivery: Delivery) -> None:
    d, server = delivery, delivery.server
    ids, messages = fire_all(d, [("acme", server.on("/a", 400)), ("acme", server.on("/b", 400))])
    first_failed = d.rig.clock()
    assert d.handle([as_received(messages[0])]) == []
    d.rig.clock.advance(3_600_000)
    second_failed = d.rig.clock()
    assert d.handle([as_received(messages[1])]) == []

    def listed(**query: str) -> list[str]:
        return [f["timer_id"] for f in d.failed(**query)]

    assert listed() == [ids[1], ids[0]]  # newest first
    assert listed(since=format_ms(second_failed)) == [ids[1]]  # since is included
    assert listed(until=format_ms(first_failed)) == [ids[0]]  # until is included
    assert listed(since="2026-11-21T11:00:00+01:00", until=format_ms(first_failed)) == [ids[0]]
    assert listed(until=format_ms(first_failed - 1)) == []
    assert listed(since=format_ms(second_failed + 1)) == []

    api = d.rig.api
    first = api.call("GET", "/v1/fires", query={"status": "failed", "limit": "1"})
    assert [f["timer_id"] for f in first.body["items"]] == [ids[1]]
    cursor = first.body["next_cursor"]
    second = api.call("GET", "/v1/fires", query={"status": "failed", "limit": "1",
                                                 "cursor": cursor})  # fmt: skip
    assert [f["timer_id"] for f in second.body["items"]] == [ids[0]]
    # a cursor is the tenant's, for its window only
    for tenant, query in [
        ("globex", {"status": "failed", "cursor": cursor}),
        ("acme", {"status": "failed", "cursor": cursor, "since": format_ms(first_failed)}),
    ]:
        reply = api.call("GET", "/v1/fires", tenant=tenant, query=query)
        assert (reply.status, reply.error_fields) == (400, {"cursor"}), (tenant, query)


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ({"status": "failed", "since": "yesterday"}, "since"),
        ({"status": "failed", "until": "2026-11-21T10:00:00"}, "until"),  # no offset
        (
            {"status": "failed", "since": "2026-11-22T00:00:00Z", "until": "2026-11-21T00:00:00Z"},
            "since",
        ),
        ({"status": "delivered"}, "status"),
        ({}, "status"),
        ({"status": "failed", "limit": "0"}, "limit"),
        ({"status": "failed", "limit": "101"}, "limit"),
    ],
)
def test_a_bad_failed_fires_query_is_a_400_with_the_contracts_body(
    rig: Rig,  # noqa: F811
    query: dict[str, str],
    field: str,
) -> None:
    reply = rig.api.call("GET", "/v1/fires", query=query)
    assert reply.status == 400, reply.body
    error = reply.body["error"]
    assert error["code"] == "validation_error" and isinstance(error["message"], str)
    assert [detail["field"] for detail in error["details"]] == [field]


def test_every_failed_fire_of_a_timer_is_redelivered_at_once(delivery: Delivery) -> None:
    d, server = delivery, delivery.server
    url = server.on("/down", 400, 400, 200, 200)
    made = d.rig.api.create(
        schedule={"type": "every", "seconds": 1}, max_fires=2, target={"url": url}
    )
    other = d.rig.api.create(schedule=after(1), target={"url": server.on("/other", 400)})
    for due in (T0 + 1_000, T0 + 2_000):
        until_armed(d.rig, due)
        d.rig.run(delivery_queue_url=d.queue)
    while messages := d.receive():
        assert d.handle(messages) == []
    assert len(d.failed()) == 3
    fires = {f"{made['id']}:{T0 + 1_000}", f"{made['id']}:{T0 + 2_000}"}

    reply = d.rig.api.call("POST", f"/v1/timers/{made['id']}/fires:redeliver")
    assert reply.status == 202, reply.body
    assert {f["fire_id"] for f in reply.body["items"]} == fires
    assert all(f["redelivered_at"] is not None for f in reply.body["items"])
    again = d.rig.api.call("POST", f"/v1/timers/{made['id']}/fires:redeliver")
    assert (again.status, again.body) == (202, {"items": []})  # nothing failed any more
    while messages := d.receive():
        assert d.handle(messages) == []
    assert {f["fire_id"] for f in d.history(made["id"]) if f["delivered_at"]} == fires
    assert len(server.at("/other")) == 1  # another timer's failed fire stays failed
    assert d.history(other["id"])[0]["status"] == "failed"


def test_a_redelivery_killed_at_any_step_loses_nothing_and_a_retry_finishes_it(
    delivery: Delivery, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed after marking the failure redelivered (before the send): the retry sends it.
    Killed after the send (before the delivery record is reopened): the message reopens the
    record itself and is delivered."""
    d, server = delivery, delivery.server
    failures = d.rig.api.runtime.failures
    url = server.on("/flaky", 400, 400, 200, 200)
    ids, messages = fire_all(d, [("acme", url), ("acme", url)])
    assert d.handle([as_received(m) for m in messages]) == []
    before_send, after_send = (f"{i}:{T0 + 1_000}" for i in ids)

    sender = failures.delivery_queue

    class Dies:
        def send(self, body: str, attributes: Mapping[str, str]) -> None:
            raise RuntimeError("killed before the send")

    failures.delivery_queue = Dies()
    reply = d.redeliver(ids[0], before_send)
    assert reply.status == 500
    # Marked redelivered (the commit point), so listed only on request; still failed.
    assert [f for f in d.failed() if f["fire_id"] == before_send] == []
    listed = d.failed(include_redelivered="true")
    (marked,) = [f for f in listed if f["fire_id"] == before_send]
    assert marked["redelivered_at"] is not None and d.receive() == []
    assert d.history(ids[0])[0]["status"] == "failed"
    failures.delivery_queue = sender
    reply = d.redeliver(ids[0], before_send)  # the retry resumes: same redelivery
    assert (reply.status, reply.body["redelivered_at"]) == (202, marked["redelivered_at"])

    def killed(*args: Any) -> bool:
        raise RuntimeError("killed after the send")

    monkeypatch.setattr(failures.records, "reopen_delivery", killed)
    assert d.redeliver(ids[1], after_send).status == 500
    assert d.history(ids[1])[0]["status"] == "failed"  # not reopened by the api ...
    while got := d.receive():
        assert d.handle(got) == []
    for timer_id in ids:  # ... but by its message: both delivered, once each
        (fire,) = d.history(timer_id)
        assert (fire["attempts"], fire["last_status"]) == (2, 200), fire
    assert len(server.at("/flaky")) == 4

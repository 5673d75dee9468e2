"""HTTP targets, the pure rules and the guarded POST against a real local HTTP server.

Delivery end to end (trigger -> delivery queue -> delivery function -> server, with moto):
tests/integration/test_webhooks.py.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import standardwebhooks

from tests.support.webhook_server import WebhookServer, webhook_server
from timers.core.failures import REDELIVERED, FailedFire
from timers.core.webhook_attempts import (
    BACKOFF_MAX_S,
    Attempt,
    DeliveryState,
    backoff_s,
    new_secret,
    signed_headers,
    verdict,
)
from timers.core.webhooks import (
    RETRY_FOR_MS,
    RetryPolicy,
    Webhook,
    address_allowed,
    gives_up,
    validate_target,
)
from timers.delivery import http_target
from timers.delivery.batches import deliver, deliver_batch
from timers.delivery.decisions import DeliveryDeps, settle_redriven
from timers.delivery.messages import DEAD_LETTERED, DEFER_MAX_S, Message, defer_wait_s, requeue_body
from timers.delivery.target_slots import Held
from timers.engine.entries import EntryRef

# ---------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("url", "headers", "field"),
    [
        ("http://example.com/hook", None, "target.url"),  # not https
        ("ftp://example.com/hook", None, "target.url"),
        ("https://user:pw@example.com/hook", None, "target.url"),  # credentials
        ("https://example.com/" + "a" * 2_048, None, "target.url"),  # too long
        ("https:///nohost", None, "target.url"),
        ("", None, "target.url"),
        ("https://example.com/hook", {"webhook-id": "x"}, "target.headers.webhook-id"),
        ("https://example.com/hook", {"Host": "evil"}, "target.headers.Host"),
        ("https://example.com/hook", {"Content-Length": "1"}, "target.headers.Content-Length"),
        (
            "https://example.com/hook",
            {"Transfer-Encoding": "x"},
            "target.headers.Transfer-Encoding",
        ),
        ("https://example.com/hook", {"X-Bad": "a\r\nb"}, "target.headers.X-Bad"),
        # a final newline: "$" in a regex matches before it (http.client refuses it at send)
        ("https://example.com/hook", {"X-Foo": "v\n"}, "target.headers.X-Foo"),
        ("https://example.com/hook", {"X-Foo\n": "v"}, "target.headers.X-Foo\n"),
        ("https://example.com/hook", {"X-Foo": "\u20ac"}, "target.headers.X-Foo"),  # not Latin-1
        ("https://example.com/gr\u00fc\u00dfe", None, "target.url"),  # sent as ASCII
        ("https://example.com/h?q=\u00fc", None, "target.url"),
        ("https://example.com/h\x7f", None, "target.url"),
        ("https://a..b/hook", None, "target.url"),  # not IDNA-encodable
        # IPv4 addresses only as a dotted quad: inet_aton reads these as 127.0.0.1
        ("https://2130706433/hook", None, "target.url"),
        ("https://0x7f.1/hook", None, "target.url"),
        ("https://0177.0.0.1/hook", None, "target.url"),
        ("https://127.1/hook", None, "target.url"),
        ("https://example.com/hook", {"bad name": "v"}, "target.headers.bad name"),
        ("https://example.com/hook", {f"x-h{i}": "v" for i in range(11)}, "target.headers"),
        ("http://127.0.0.1:8080/hook", None, "target.url"),  # loopback not allowed here
    ],
)
def test_bad_targets_name_the_offending_field(url: str, headers: Any, field: str) -> None:
    webhook, errors = validate_target(url, headers)
    assert webhook is None
    assert field in {e.field for e in errors}


def test_good_targets_and_loopback_only_when_allowed() -> None:
    webhook, errors = validate_target("https://example.com/h?x=1", {"Authorization": "Bearer t"})
    assert errors == [] and webhook == Webhook(
        "https://example.com/h?x=1", (("Authorization", "Bearer t"),)
    )
    assert validate_target("http://127.0.0.1:9/h", None, allow_loopback=True)[0] is not None
    assert validate_target("http://localhost:9/h", None, allow_loopback=True)[0] is not None
    assert validate_target("http://10.0.0.1/h", None, allow_loopback=True)[0] is None
    # the rest of 127/8 is refused at delivery even with the setting: no http:// for it either
    assert validate_target("http://127.0.0.2:9/h", None, allow_loopback=True)[0] is None
    for url in (
        "https://b\u00fccher.example/h",
        "https://93.184.216.34/h",
        "https://[2001:4860::1]/",
    ):
        assert validate_target(url, None) == (Webhook(url), [])
    assert Webhook("https://Example.com/h").origin == "https://example.com:443"


# ---------------------------------------------------------------- signatures


def test_a_consumer_verifies_the_signature_with_standardwebhooks() -> None:
    secret = new_secret()
    assert secret.startswith("whsec_")
    body = b'{"fire_id":"tmr_x:1","payload":{"a":"gr\xc3\xbc\xc3\x9fe"}}'
    verifier = standardwebhooks.Webhook(secret)
    now = int(time.time())  # the library checks the timestamp against its own clock
    headers = signed_headers([secret], "tmr_x:1", now, body)
    assert verifier.verify(body, headers) == json.loads(body)
    tampered = body.replace(b"tmr_x:1", b"tmr_y:1")
    with pytest.raises(standardwebhooks.WebhookVerificationError):
        verifier.verify(tampered, headers)


def test_during_a_rotation_both_secrets_sign() -> None:
    old, new = new_secret(), new_secret()
    body, now = b'{"x":1}', int(time.time())
    headers = signed_headers([new, old], "id1", now, body)
    assert len(headers["webhook-signature"].split(" ")) == 2
    for secret in (old, new):
        standardwebhooks.Webhook(secret).verify(body, headers)
    with pytest.raises(standardwebhooks.WebhookVerificationError):
        standardwebhooks.Webhook(new_secret()).verify(body, headers)


# ---------------------------------------------------------------- addresses, verdicts, backoff


@pytest.mark.parametrize(
    ("address", "allowed"),
    [
        # public unicast
        ("93.184.216.34", True),
        ("8.8.8.8", True),
        ("2606:2800:220:1:248:1893:25c8:1946", True),
        ("2a05:d018::1", True),
        # IPv4 special-purpose ranges
        ("0.0.0.0", False),
        ("0.1.2.3", False),  # "this network"
        ("10.1.2.3", False),
        ("100.64.0.1", False),  # shared (CGNAT)
        ("127.0.0.1", False),
        ("127.8.8.8", False),
        ("169.254.169.254", False),  # EC2/ECS metadata
        ("172.16.0.1", False),
        ("172.31.255.255", False),
        ("192.0.0.9", False),  # IETF assignments (is_global says True on some Pythons)
        ("192.0.2.1", False),  # documentation
        ("192.88.99.1", False),  # 6to4 relay anycast
        ("192.168.1.1", False),
        ("198.18.0.1", False),  # benchmarking
        ("198.51.100.1", False),
        ("203.0.113.1", False),
        ("224.0.0.1", False),  # multicast
        ("240.0.0.1", False),  # reserved
        ("255.255.255.255", False),
        # IPv6 special-purpose ranges
        ("::", False),
        ("::1", False),
        ("100::1", False),  # discard
        ("2001:db8::1", False),  # documentation
        ("3fff::1", False),  # documentation
        ("5f00::1", False),  # SRv6
        ("fd00:ec2::254", False),  # EC2 metadata over IPv6 (unique local)
        ("fc00::1", False),
        ("fe80::1", False),
        ("fe80::1%eth0", False),
        ("fec0::1", False),  # site-local
        ("ff02::1", False),  # multicast
        ("4000::1", False),  # outside 2000::/3: not allocated for global unicast
        # IPv6 that carries IPv4: judged by the IPv4 address
        ("::ffff:127.0.0.1", False),  # IPv4-mapped
        ("::ffff:10.0.0.1", False),
        ("::ffff:169.254.169.254", False),
        ("::ffff:93.184.216.34", True),
        ("64:ff9b::a9fe:a9fe", False),  # NAT64 of 169.254.169.254
        ("64:ff9b::7f00:1", False),  # NAT64 of 127.0.0.1
        ("64:ff9b::a00:1", False),  # NAT64 of 10.0.0.1
        ("64:ff9b::5db8:d822", True),  # NAT64 of 93.184.216.34: what DNS64 answers
        ("2002:a9fe:a9fe::1", False),  # 6to4 of 169.254.169.254
        ("2002:c0a8:101::1", False),  # 6to4 of 192.168.1.1
        ("2002:5db8:d822::1", True),  # 6to4 of 93.184.216.34
        # refused whatever they carry
        ("64:ff9b:1::a9fe:a9fe", False),  # local-use NAT64: the IPv4 sits where the site says
        ("64:ff9b:1::5db8:d822", False),
        ("::a9fe:a9fe", False),  # IPv4-compatible (deprecated)
        ("::5db8:d822", False),
        ("2001:0:4136:e378:8000:63bf:3fff:fdd2", False),  # Teredo
        ("2001:0:5db8:d822::1", False),
        ("not an ip", False),
        ("", False),
    ],
)
def test_only_public_addresses_are_allowed(address: str, allowed: bool) -> None:
    assert address_allowed(address) is allowed


@pytest.mark.parametrize(
    ("address", "allowed"),
    [
        ("127.0.0.1", True),
        ("::1", True),
        ("127.0.0.2", False),
        ("::ffff:127.0.0.1", False),
        ("64:ff9b::7f00:1", False),
        ("2002:7f00:1::1", False),
        ("10.0.0.1", False),
    ],
)
def test_the_loopback_setting_admits_127_0_0_1_and_ipv6_loopback_only(
    address: str, allowed: bool
) -> None:
    assert address_allowed(address, allow_loopback=True) is allowed


@pytest.mark.parametrize(
    ("attempt", "expected"),
    [
        (Attempt(200), "delivered"),
        (Attempt(204), "delivered"),
        (Attempt(408), "retry"),
        (Attempt(429), "retry"),
        (Attempt(500), "retry"),
        (Attempt(503), "retry"),
        (Attempt(400), "failed"),
        (Attempt(401), "failed"),
        (Attempt(404), "failed"),
        (Attempt(410), "failed"),
        (Attempt(301), "failed"),  # redirects are not followed
        (Attempt(error="timeout"), "retry"),
        (Attempt(error="connection_error"), "retry"),
        (Attempt(error="blocked_address"), "failed"),
        (Attempt(error="invalid_target"), "failed"),
    ],
)
def test_verdicts(attempt: Attempt, expected: str) -> None:
    assert verdict(attempt) == expected


def test_backoff_grows_is_capped_and_jittered_within_the_upper_half() -> None:
    assert backoff_s(1, 0.0) == 2.5 and backoff_s(1, 0.999) < 5.0
    assert backoff_s(2, 0.0) == 5.0
    assert all(backoff_s(n, 0.5) <= BACKOFF_MAX_S for n in range(1, 200))
    assert backoff_s(50, 0.0) == BACKOFF_MAX_S / 2
    # the budget: the first attempt 24 h old
    assert not gives_up(0, 24 * 3_600_000 - 1) and gives_up(0, 24 * 3_600_000)


# ---------------------------------------------------------------- the guarded POST


@pytest.fixture
def server() -> Iterator[WebhookServer]:
    with webhook_server() as s:
        yield s


def test_post_sends_the_body_and_headers_and_reads_the_status(server: WebhookServer) -> None:
    url = server.on("/ok", 201)
    headers = {"X-Custom": "v", "Content-Type": "text/plain"}  # ours wins: the body is JSON
    got = http_target.post(url, b'{"a":1}', headers, allow_loopback=True)
    assert (got.status, got.error, got.body) == (201, None, "ok")
    (request,) = server.at("/ok")
    assert request.body == b'{"a":1}'
    assert request.headers["x-custom"] == "v"
    assert request.headers["content-type"] == "application/json"


def test_loopback_is_refused_without_the_setting(server: WebhookServer) -> None:
    url = server.on("/ok").replace("http://", "https://")
    assert http_target.post(url, b"{}", {}).error == "blocked_address"
    assert server.received == []


@pytest.mark.parametrize(
    "address",
    [
        "10.0.0.7",
        "169.254.169.254",
        "fd00:ec2::254",
        "192.168.0.1",
        "::1",
        "64:ff9b::a9fe:a9fe",  # NAT64 of the metadata endpoint
        "64:ff9b:1::a00:7",
        "2002:a9fe:a9fe::1",  # 6to4 of it
        "::a9fe:a9fe",
        "fec0::1",
    ],
)
def test_names_that_resolve_to_private_or_metadata_addresses_are_refused(address: str) -> None:
    def resolver(host: str, port: int) -> list[str]:
        return ["93.184.216.34", address]  # one bad address is enough

    got = http_target.post("https://hooks.example.com/x", b"{}", {}, resolver=resolver)
    assert got.error == "blocked_address"


def test_the_connected_peer_is_checked_again(server: WebhookServer) -> None:
    """A vetted address that still lands somewhere refused (rebinding, a proxy) is caught
    once connected: here the pinned connection meets loopback without the setting."""
    conn = http_target._PinnedHTTPConnection("hooks.example.com", server.port, "127.0.0.1",
                                             allow_loopback=False, timeout=5)  # fmt: skip
    with pytest.raises(http_target._Blocked):
        conn.connect()


@pytest.mark.parametrize(
    ("path", "headers"),
    [
        ("/ok", {"X-Foo": "v\n"}),
        ("/ok", {"X-Foo\n": "v"}),
        ("/ok", {"X-Foo": "\u20ac"}),  # not Latin-1
        ("/gr\u00fc\u00dfe", {}),  # the request line is ASCII
        ("/a\x01b", {}),
    ],
)
def test_a_target_http_client_refuses_to_send_fails_at_once_unsent(
    server: WebhookServer, path: str, headers: dict[str, str]
) -> None:
    """Stored before validation caught it: retrying would only fail the same way for 24 h."""
    url = server.on("/ok").replace("/ok", path)
    got = http_target.post(url, b"{}", headers, allow_loopback=True)
    assert (got.status, got.error) == (None, "invalid_target") and verdict(got) == "failed"
    assert server.received == []


def test_a_host_name_that_does_not_idna_encode_fails_at_once() -> None:
    got = http_target.post("https://a..b/x", b"{}", {})  # the real resolver
    assert (got.status, got.error) == (None, "invalid_target")


def test_redirects_are_not_followed(server: WebhookServer) -> None:
    url = server.on("/moved", 302)
    server.endpoints["/moved"].location = server.url("/elsewhere")
    assert http_target.post(url, b"{}", {}, allow_loopback=True).status == 302
    assert server.at("/elsewhere") == []


def test_an_attempt_keeps_the_answers_first_512_bytes_as_text_and_its_latency(
    server: WebhookServer,
) -> None:
    answer = b"x" + "é".encode() * 300  # byte 512 splits an é: it reads as a replacement
    url = server.on("/long", 500, body=answer)
    read: list[float] = []

    def clock() -> float:  # the injected clock: 50 ms more at each reading
        read.append(10.0 + 0.05 * len(read))
        return read[-1]

    got = http_target.post(url, b"{}", {}, allow_loopback=True, clock=clock)
    assert got.status == 500
    assert got.body == "x" + "é" * 255 + "\ufffd"
    assert got.latency_ms == round((read[-1] - read[0]) * 1000) > 0  # first to last reading


def test_an_attempt_without_an_answer_keeps_no_body_and_still_its_latency(
    server: WebhookServer,
) -> None:
    url = server.on("/hang", 200, hold=threading.Event())
    got = http_target.post(url, b"{}", {}, allow_loopback=True, timeout_s=0.2)
    assert (got.status, got.error, got.body) == (None, "timeout", "")
    assert got.latency_ms >= 200


def test_a_hanging_endpoint_is_a_timeout(server: WebhookServer) -> None:
    url = server.on("/slow", 200, hold=threading.Event())
    got = http_target.post(url, b"{}", {}, allow_loopback=True, timeout_s=0.3)
    assert got.error == "timeout"


def test_a_trickling_endpoint_is_cut_at_the_attempts_timeout() -> None:
    """Each read gets a byte in time; the attempt as a whole still ends (the watchdog)."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65_536)
            conn.sendall(b"HTTP/1.1 200 OK\r\n")
            while not stop.is_set():
                try:
                    conn.sendall(b"X")  # a header that never ends
                except OSError:
                    return
                stop.wait(0.05)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{listener.getsockname()[1]}/"
        got = http_target.post(url, b"{}", {}, allow_loopback=True, timeout_s=0.5)
        assert got.error == "timeout"
    finally:
        stop.set()
        listener.close()


# ---------------------------------------------------------------- deliver, with fakes


class Records:
    def __init__(self) -> None:
        self.states: dict[EntryRef, DeliveryState] = {}

    def read_delivery(self, ref: EntryRef) -> DeliveryState | None:
        return self.states.get(ref)

    def write_delivery(
        self, ref: EntryRef, state: DeliveryState, previous: DeliveryState | None
    ) -> bool:
        if self.states.get(ref) != previous:
            return False
        self.states[ref] = state
        return True


class FailedFires:
    """The failed-fires table: the first put of a failure stands (a conditional put)."""

    def __init__(self) -> None:
        self.records: dict[tuple[str, str], FailedFire] = {}
        self.puts = 0

    def put(self, record: FailedFire) -> None:
        self.puts += 1
        self.records.setdefault((record.tenant, record.at), record)


class Slots:
    def __init__(self, limit: int) -> None:
        self.limit, self.held = limit, 0
        self.lock = threading.Lock()

    def acquire(self, tenant: str, origin: str, now_ms: int, want: int = 1) -> Held | None:
        with self.lock:
            got = min(want, self.limit - self.held)
            if got <= 0:
                return None
            self.held += got
            return Held((origin,), got)

    def release(self, held: Held | None) -> None:
        with self.lock:
            self.held -= held.count if held is not None else 0


def message(url: str, fire: str = "tmr_a:1000", claim: str = "7/1 tmr_a@000") -> Message:
    return Message(
        message_id=fire,
        receipt_handle="rh",
        body=json.dumps({"fire_id": fire}),
        attributes={
            "fire_id": fire,
            "tenant": "acme",
            "claim": claim,
            "target": Webhook(url, (("X-Tenant-Header", "1"),)).to_json(),
        },
    )


@pytest.fixture
def requeued() -> list[tuple[Message, int]]:
    """Deferred messages sent again, with their delays."""
    return []


@pytest.fixture
def deps(
    requeued: list[tuple[Message, int]],
) -> Iterator[tuple[DeliveryDeps, list[tuple[Message, str]]]]:
    dead: list[tuple[Message, str]] = []
    now = [1_000_000]
    secret = new_secret()

    def post(url: str, body: bytes, headers: Mapping[str, str]) -> Attempt:
        return http_target.post(url, body, headers, allow_loopback=True, timeout_s=5)

    yield (
        DeliveryDeps(
            records=Records(),
            slots=Slots(8),
            secrets=lambda tenant: [secret],
            post=post,
            dead_letter=lambda m, reason: dead.append((m, reason)),
            requeue=lambda m, delay_s: requeued.append((m, delay_s)),
            failed_fires=FailedFires(),
            clock=lambda: now[0],
            jitter=lambda: 0.0,
        ),
        dead,
    )


def test_one_slow_endpoint_does_not_delay_another_in_the_same_batch(
    server: WebhookServer, deps: tuple[DeliveryDeps, Any]
) -> None:
    fast_arrived = threading.Event()
    slow = server.on("/slow", 200, hold=fast_arrived)
    fast = server.on("/fast", 200)
    d, _ = deps
    original = d.post

    def post(url: str, body: bytes, headers: Mapping[str, str]) -> Attempt:
        got = original(url, body, headers)
        if url == fast:
            fast_arrived.set()
        return got

    d.post = post
    report = deliver_batch(
        [message(slow, "tmr_s:1", "1/1 tmr_s@001"), message(fast, "tmr_f:1", "2/1 tmr_f@001")], d
    )
    # The slow endpoint answered only after the fast one was delivered: had the batch been
    # handled in order, the slow POST would have waited out its hold and the fast one after it.
    assert fast_arrived.is_set()
    assert {k: o.verdict for k, o in report.outcomes.items()} == {
        "tmr_s:1": "delivered",
        "tmr_f:1": "delivered",
    }


def test_a_target_at_its_cap_is_deferred_without_an_attempt(
    server: WebhookServer, deps: tuple[DeliveryDeps, Any], requeued: list[tuple[Message, int]]
) -> None:
    d, _ = deps
    d.slots = Slots(0)
    deferred = message(server.on("/x"))
    outcome = deliver(deferred, d)
    # sent again with a delay, and this copy deleted (no retry_in_s): a fresh receive count
    assert outcome.verdict == "deferred" and outcome.retry_in_s is None
    assert requeued == [(deferred, 1)]
    assert server.received == []
    assert isinstance(d.records, Records) and d.records.states == {}


def test_a_batch_takes_one_origins_slots_once_and_its_other_origins_their_own(
    server: WebhookServer, deps: tuple[DeliveryDeps, Any]
) -> None:
    """Three messages to one origin ask the caps once, for three; a fourth, to another origin,
    asks for its own; every slot is given back once the batch is done."""
    d, _ = deps
    asked: list[tuple[str, int]] = []
    slots = Slots(8)

    def acquire(tenant: str, origin: str, now_ms: int, want: int = 1) -> Held | None:
        asked.append((origin, want))
        return Slots.acquire(slots, tenant, origin, now_ms, want)

    d.slots = SimpleNamespace(acquire=acquire, release=slots.release)  # type: ignore[assignment]
    a, b = server.on("/a"), server.on("/b").replace("127.0.0.1", "localhost")
    batch = [message(a, f"tmr_{i}:1", f"{i}/1 tmr_{i}@001") for i in range(3)]
    batch.append(message(b, "tmr_b:1", "9/1 tmr_b@001"))
    report = deliver_batch(batch, d)
    assert report.count("delivered") == 4
    assert sorted(asked) == sorted([(Webhook(a).origin, 3), (Webhook(b).origin, 1)])
    assert slots.held == 0


def test_a_batch_whose_slots_cannot_be_asked_stays_on_the_queue(
    server: WebhookServer, deps: tuple[DeliveryDeps, Any], requeued: list[tuple[Message, int]]
) -> None:
    d, _ = deps

    def broken(tenant: str, origin: str, now_ms: int, want: int = 1) -> Held | None:
        raise ConnectionError("DynamoDB unreachable")

    d.slots = SimpleNamespace(acquire=broken, release=lambda held: None)  # type: ignore[assignment]
    assert deliver(message(server.on("/x")), d).verdict == "error"  # back after its timeout
    assert server.received == [] and requeued == []


def test_deferrals_back_off_and_the_copy_sent_again_counts_them() -> None:
    assert [defer_wait_s(n, 0.0) for n in range(10)] == [1, 2, 4, 8, 16, 32, 64, 128, 150, 150]
    assert defer_wait_s(0, 0.999) == 2 and defer_wait_s(40, 0.999) == DEFER_MAX_S
    original = message("https://example.com/x")
    first = requeue_body(original, 1)
    assert (first["MessageBody"], first["DelaySeconds"]) == (original.body, 1)
    attributes = {k: v["StringValue"] for k, v in first["MessageAttributes"].items()}
    assert attributes == {**original.attributes, "deferrals": "1"}
    again = Message("m2", "rh2", first["MessageBody"], attributes)
    assert requeue_body(again, 2)["MessageAttributes"]["deferrals"]["StringValue"] == "2"
    assert requeue_body(again, 5_000)["DelaySeconds"] == 900  # SQS's most


def test_a_fire_that_waits_for_a_slot_past_the_retry_budget_fails(
    server: WebhookServer, deps: tuple[DeliveryDeps, Any], requeued: list[tuple[Message, int]]
) -> None:
    d, dead = deps
    d.slots = Slots(0)
    url = server.on("/x")
    d.clock = lambda: 1_000 + RETRY_FOR_MS - 1  # due at 1,000 ms (its fire id), never attempted
    assert deliver(message(url, "tmr_a:1000"), d).verdict == "deferred"
    d.clock = lambda: 1_000 + RETRY_FOR_MS
    outcome = deliver(message(url, "tmr_a:1000"), d)
    reason = "gave up after 0 attempts: concurrency_cap"
    assert (outcome.verdict, outcome.reason, outcome.retry_in_s) == ("failed", reason, None)
    assert isinstance(d.records, Records)
    failed_ms = 1_000 + RETRY_FOR_MS
    assert d.records.states[("7/1", "tmr_a@000")] == DeliveryState(
        failed=reason, failed_ms=failed_ms
    )
    assert [r for _, r in dead] == [reason] and len(requeued) == 1
    assert isinstance(d.failed_fires, FailedFires)
    (record,) = d.failed_fires.records.values()
    assert (record.fire_id, record.reason, record.failed_ms) == ("tmr_a:1000", reason, failed_ms)
    assert server.received == []


def test_a_redriven_message_fails_its_fire_dead_lettered_unless_settled(
    deps: tuple[DeliveryDeps, Any],
) -> None:
    d, dead = deps
    records = d.records
    assert isinstance(records, Records)
    url = "https://example.com/x"
    never = message(url, "tmr_a:1", "7/1 tmr_a@001")
    retried = message(url, "tmr_b:1", "7/1 tmr_b@001")
    records.states[("7/1", "tmr_b@001")] = DeliveryState(3, 10, 20, 503)
    failed = message(url, "tmr_c:1", "7/1 tmr_c@001")
    records.states[("7/1", "tmr_c@001")] = DeliveryState(1, 10, 10, 400, failed="http 400")
    delivered = message(url, "tmr_d:1", "7/1 tmr_d@001")
    records.states[("7/1", "tmr_d@001")] = DeliveryState(1, 10, 10, 200, delivered_ms=10)
    broken = Message("m5", "rh", "{}", {"fire_id": "x"})

    verdicts = [settle_redriven(m, d).verdict for m in (never, retried, failed, delivered, broken)]
    assert verdicts == [
        "dead_lettered",
        "dead_lettered",
        "dead_lettered",
        "duplicate",
        "dead_lettered",
    ]
    now = d.clock()
    assert records.states[("7/1", "tmr_a@001")] == DeliveryState(
        failed=DEAD_LETTERED, failed_ms=now
    )
    assert records.states[("7/1", "tmr_b@001")] == DeliveryState(
        3, 10, 20, 503, failed=DEAD_LETTERED, failed_ms=now
    )
    assert records.states[("7/1", "tmr_c@001")].failed == "http 400"  # its own reason stands
    assert records.states[("7/1", "tmr_d@001")].failed is None
    assert [(m.message_id, r) for m, r in dead] == [
        ("tmr_a:1", DEAD_LETTERED),
        ("tmr_b:1", DEAD_LETTERED),
        ("tmr_c:1", "http 400"),
        ("m5", DEAD_LETTERED),
    ]
    # The two it failed are recorded; tmr_c's failure had no failed-at time (recorded before
    # failures were) and the broken message no tenant: nothing to record.
    assert isinstance(d.failed_fires, FailedFires)
    assert {(r.fire_id, r.reason, r.attempts) for r in d.failed_fires.records.values()} == {
        ("tmr_a:1", DEAD_LETTERED, 0),
        ("tmr_b:1", DEAD_LETTERED, 3),
    }


def test_retry_after_lengthens_the_backoff_up_to_the_cap(
    server: WebhookServer, deps: tuple[DeliveryDeps, Any]
) -> None:
    d, _ = deps
    url = server.on("/busy", 429)
    server.endpoints["/busy"].headers["Retry-After"] = "120"
    outcome = deliver(message(url), d)
    assert (outcome.verdict, outcome.retry_in_s) == ("retry", 120)  # not the 2.5 s backoff
    server.endpoints["/busy"].headers["Retry-After"] = "999999"
    outcome = deliver(message(url, "tmr_b:1", "7/1 tmr_b@001"), d)
    assert outcome.retry_in_s == BACKOFF_MAX_S
    server.endpoints["/busy"].headers["Retry-After"] = "Wed, 21 Oct 2026 07:28:00 GMT"
    outcome = deliver(message(url, "tmr_c:1", "7/1 tmr_c@001"), d)
    assert outcome.retry_in_s == 2  # an HTTP date is not read: the backoff (2.5 s) applies


def test_a_settled_fire_is_not_posted_again(
    server: WebhookServer, deps: tuple[DeliveryDeps, Any]
) -> None:
    d, _ = deps
    url = server.on("/x")
    assert deliver(message(url), d).verdict == "delivered"
    assert deliver(message(url), d).verdict == "duplicate"  # SQS handed it out twice
    assert len(server.at("/x")) == 1


def test_a_failure_is_recorded_with_its_message_once_and_again_by_a_later_copy(
    server: WebhookServer, deps: tuple[DeliveryDeps, Any]
) -> None:
    """A 400 fails the fire: recorded with the message's body and attributes (what a
    redelivery sends), its reason, last status and attempts. A later copy of the message (its
    first handler may have died between the delivery record and this one) writes it again,
    and the first write stands."""
    d, _ = deps
    failed_fires = d.failed_fires
    assert isinstance(failed_fires, FailedFires)
    m = message(server.on("/gone", 400), "tmr_a:1000")
    assert deliver(m, d).verdict == "failed"
    (record,) = failed_fires.records.values()
    assert record == FailedFire(
        tenant="acme", fire_id="tmr_a:1000", timer_id="tmr_a", reason="http 400",
        last_status=400, attempts=1, failed_ms=d.clock(), body=m.body,
        attributes=dict(m.attributes),
    )  # fmt: skip
    assert record.at == f"{d.clock():013d}#tmr_a:1000"
    again = Message("m2", "rh2", m.body, {**m.attributes, "deferrals": "3"})
    assert deliver(again, d).verdict == "duplicate"
    assert failed_fires.puts == 2 and list(failed_fires.records.values()) == [record]
    assert len(server.at("/gone")) == 1


def test_a_redelivered_message_reopens_a_failure_from_before_its_redelivery_only(
    server: WebhookServer, deps: tuple[DeliveryDeps, Any]
) -> None:
    """The api stamps a redelivered message with the time of the redelivery: a record that
    failed before it is pending again for that message (even if the api's own reopening has
    not been written yet) - attempts kept, a new retry budget from the stamp; a failure after
    the stamp is the redelivery's own, and its copies are duplicates."""
    d, _ = deps
    records = d.records
    assert isinstance(records, Records)
    ref = ("7/1", "tmr_a@000")
    records.states[ref] = DeliveryState(2, 10, 20, 503, failed="gave up", failed_ms=30)
    url = server.on("/back", 200)
    plain = message(url, "tmr_a:1000")
    assert deliver(plain, d).verdict == "duplicate"  # not redelivered: the failure stands
    stamped = Message("m2", "rh", plain.body, {**plain.attributes, REDELIVERED: "40"})
    assert deliver(stamped, d).verdict == "delivered"
    assert replace(records.states[ref], last_latency_ms=None) == DeliveryState(
        3, 40, d.clock(), 200, last_body="ok", delivered_ms=d.clock(), base_attempts=2
    )  # the budget counted from the redelivery (first_ms 40), the attempts went on
    records.states[ref] = DeliveryState(3, 40, 50, 400, failed="http 400", failed_ms=50)
    assert deliver(stamped, d).verdict == "duplicate"  # failed after its redelivery
    assert len(server.at("/back")) == 1

    # Stamped by an api whose clock is ahead of this one: its failure still comes after it.
    ahead = d.clock() + 5_000
    server.on("/back", 400)
    late = Message("m3", "rh", plain.body, {**plain.attributes, REDELIVERED: str(ahead)})
    assert deliver(late, d).verdict == "failed"
    assert records.states[ref].failed_ms == ahead + 1
    assert deliver(late, d).verdict == "duplicate"


def test_a_message_without_its_attributes_is_dead_lettered(
    deps: tuple[DeliveryDeps, Any],
) -> None:
    d, dead = deps
    broken = Message("m1", "rh", "{}", {"fire_id": "x"})
    assert deliver(broken, d).verdict == "invalid"
    assert [reason for _, reason in dead] == ["invalid_message"]


def test_the_sample_event_is_what_the_handler_reads(
    deps: tuple[DeliveryDeps, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """events/delivery.json (``sam local invoke DeliveryFunction -e``) parses into a message
    with everything delivery needs, and a retry becomes a batch item failure."""
    from functions.delivery import app
    from ops.local.context import LambdaContext

    event = json.loads((Path(__file__).resolve().parents[2] / "events/delivery.json").read_text())
    (message,) = [Message.from_record(r) for r in event["Records"]]
    assert message.attributes["tenant"] == "demo"
    assert Webhook.from_json(message.attributes["target"]).url.startswith("https://")
    d, _ = deps
    d.post = lambda url, body, headers: Attempt(503)
    visibility: list[int] = []
    monkeypatch.setattr(app, "deps", lambda: d)
    monkeypatch.setattr(app, "_retry_later", lambda record, seconds: visibility.append(seconds))
    answer = app.handler(event, LambdaContext(function_name="delivery"))
    assert answer == {"batchItemFailures": [{"itemIdentifier": message.message_id}]}
    assert visibility == [2]  # the first retry's backoff, jitter 0: 2.5 s rounded


# ---------------------------------------------------------------- a timer's retry policy


def with_retry(m: Message, **policy: int) -> Message:
    """The message as the trigger sends it for a timer with ``retry``."""
    return replace(m, attributes={**m.attributes, "retry": json.dumps(policy)})


@pytest.mark.parametrize(
    ("policy", "errors"),
    [
        (RetryPolicy(0), {"retry.max_attempts"}),
        (RetryPolicy(101), {"retry.max_attempts"}),
        (RetryPolicy(None, 59), {"retry.max_age_seconds"}),
        (RetryPolicy(None, 86_401), {"retry.max_age_seconds"}),
        (RetryPolicy(1, 60), set()),
        (RetryPolicy(100, 86_400), set()),
    ],
)
def test_a_retry_policys_bounds(policy: RetryPolicy, errors: set[str]) -> None:
    assert {e.field for e in policy.errors()} == errors


def test_max_attempts_ends_the_fire_failed_with_no_further_post(
    server: WebhookServer, deps: tuple[DeliveryDeps, Any]
) -> None:
    d, dead = deps
    down = with_retry(message(server.on("/down", 503)), max_attempts=2)
    first = deliver(down, d)
    assert first.verdict == "retry"
    second = deliver(down, d)  # the second POST is the last one
    assert (second.verdict, second.reason) == (
        "failed", "gave up after 2 attempts (max_attempts): http 503"
    )  # fmt: skip
    assert len(server.at("/down")) == 2
    assert [reason for _, reason in dead] == [second.reason]
    state = d.records.read_delivery(("7/1", "tmr_a@000"))
    assert state is not None and state.failed == second.reason and state.attempts == 2
    assert deliver(down, d).verdict == "duplicate" and len(server.at("/down")) == 2


def test_max_age_counts_from_the_due_time_and_fails_a_waiting_fire_without_a_post(
    server: WebhookServer, deps: tuple[DeliveryDeps, Any]
) -> None:
    d, dead = deps
    now = [1_000 + 30_000]  # the fire (due at 1000) is 30 s late already
    d.clock = lambda: now[0]
    down = with_retry(message(server.on("/down", 503)), max_age_seconds=60)
    first = deliver(down, d)
    assert first.verdict == "retry"
    assert first.retry_in_s is not None and first.retry_in_s <= 30  # back by the deadline
    now[0] = 1_000 + 60_000  # its age is spent: no further POST
    second = deliver(down, d)
    assert (second.verdict, second.reason) == (
        "failed", "gave up after 1 attempts (max_age): http 503"
    )  # fmt: skip
    assert len(server.at("/down")) == 1
    assert dead[-1][1] == second.reason


def test_without_a_policy_the_default_budget_still_applies(
    server: WebhookServer, deps: tuple[DeliveryDeps, Any]
) -> None:
    d, _ = deps
    down = message(server.on("/down", 503))
    for _ in range(5):
        assert deliver(down, d).verdict == "retry"  # no attempt cap by default
    assert len(server.at("/down")) == 5


def test_a_redelivery_gives_the_policy_a_new_budget(
    server: WebhookServer, deps: tuple[DeliveryDeps, Any]
) -> None:
    d, _ = deps
    now = [5_000]
    d.clock = lambda: now[0]
    down = with_retry(message(server.on("/down", 503)), max_attempts=1)
    assert deliver(down, d).verdict == "failed"  # one POST, then the cap
    now[0] = 9_000
    again = replace(down, attributes={**down.attributes, REDELIVERED: "8000"})
    got = deliver(again, d)
    assert got.verdict == "failed" and "(max_attempts)" in (got.reason or "")
    assert len(server.at("/down")) == 2  # the redelivery's own one POST

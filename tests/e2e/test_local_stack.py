"""The whole service on this machine, reached only as a user reaches it: over HTTP, through
``make tenant`` (``python -m ops.admin``), the Lambda Invoke API and the tenants' SQS queues.

One stack serves the module (one per xdist worker that runs its tests). It runs on the
wall clock, so these tests poll queues with deadlines; nothing here asserts a duration.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
import standardwebhooks
from botocore.exceptions import ClientError

from tests.support.callbacks import drain
from tests.support.local_stack import RunningStack, admin, start_stack
from tests.support.webhook_server import webhook_server
from timers.core.times import format_ms

pytestmark = pytest.mark.e2e

DEMO_KEY = "tk_e2e-demo-key-0123456789abcdefghijklmnop"
DELIVERY_TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningStack]:
    running = start_stack(
        tmp_path_factory.mktemp("stack"),
        TIMERS_DEMO_API_KEY=DEMO_KEY,
        TIMERS_ALLOW_LOOPBACK_TARGETS="1",  # webhooks to this test's own server
    )
    try:
        running.wait_ready()
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="module")
def sqs(stack: RunningStack) -> Any:
    return boto3.client(
        "sqs",
        endpoint_url=stack.aws_endpoint,
        region_name="us-east-1",
        aws_access_key_id="local",
        aws_secret_access_key="local",
    )


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def collect(
    sqs: Any, queues: dict[str, str], want: dict[str, int], until_ms: int
) -> dict[str, list[dict[str, Any]]]:
    """Drain the queues until each has ``want`` messages and the clock passed ``until_ms``
    (so a fire that must never come has had its chance to)."""
    got: dict[str, list[dict[str, Any]]] = {name: [] for name in queues}
    deadline = time.monotonic() + DELIVERY_TIMEOUT_S
    while time.monotonic() < deadline:
        for name, url in queues.items():
            got[name] += drain(sqs, url, None)  # checks the body and never-early
        if all(len(got[n]) >= want[n] for n in want) and now_ms() > until_ms:
            return got
        time.sleep(0.2)  # polling a queue the stack fills on the wall clock
    raise AssertionError(f"callbacks missing after {DELIVERY_TIMEOUT_S}s: {got}")


def test_ready_lines_name_the_endpoints_and_a_working_demo_key(stack: RunningStack) -> None:
    api_port, aws_port, _ = stack.ports
    assert stack.api == f"http://127.0.0.1:{api_port}/v1"
    assert stack.console == f"http://127.0.0.1:{api_port}/v1/console"
    status, page, headers = stack.request("GET", "/console", content_type=None)
    assert (status, headers["content-type"]) == (200, "text/html; charset=utf-8")
    assert "Timer service console" in page
    assert stack.aws_endpoint == f"http://127.0.0.1:{aws_port}"
    assert stack.ready["Tenant demo API key: "] == DEMO_KEY
    status, body, _ = stack.request("GET", "/tenant", key=DEMO_KEY)
    assert status == 200
    secret = body.pop("webhook_secret")
    assert secret.startswith("whsec_")
    assert body == {
        "tenant": "demo",
        "callback_queue_url": stack.ready["Tenant demo callback queue: "],
        "retention_days": 30,
    }
    # `make tenant NAME=demo` prints the same key and queue while the stack runs.
    assert admin(stack, "tenant", "create", "demo") == {
        "tenant": "demo",
        "api_key": DEMO_KEY,
        "callback_queue_url": body["callback_queue_url"],
        "webhook_secret": secret,
    }


def test_two_tenants_fire_on_time_cancelled_never_fires_every_second_repeats(
    stack: RunningStack, sqs: Any
) -> None:
    acme = admin(stack, "tenant", "create", "acme")
    a_key, b_key = DEMO_KEY, acme["api_key"]
    start = now_ms()
    at = format_ms(start + 3_000)

    def create(key: str, schedule: dict[str, Any], **extra: Any) -> dict[str, Any]:
        status, timer, _ = stack.request(
            "POST", "/timers", key=key, body={"schedule": schedule, **extra}
        )
        assert status == 201, timer
        return timer

    a_once = create(a_key, {"type": "at", "at": at}, payload={"for": "demo"})
    a_cancelled = create(a_key, {"type": "at", "at": at}, payload={"cancelled": True})
    assert stack.request("DELETE", f"/timers/{a_cancelled['id']}", key=a_key)[0] == 204
    b_once = create(b_key, {"type": "after", "seconds": 2}, payload={"for": "acme"})
    b_every = create(b_key, {"type": "every", "seconds": 1}, max_fires=4, payload=[1, 2])

    got = collect(
        sqs,
        {"demo": stack.ready["Tenant demo callback queue: "], "acme": acme["callback_queue_url"]},
        want={"demo": 1, "acme": 5},
        until_ms=start + 3_000 + 3_000,  # the cancelled timer's time, plus a trigger's margin
    )

    # The one-shot arrived once, the cancelled one never; each queue holds only its tenant's.
    assert [(m["timer_id"], m["payload"]) for m in got["demo"]] == [(a_once["id"], {"for": "demo"})]
    assert {m["tenant"] for m in got["demo"]} == {"demo"}
    assert {m["tenant"] for m in got["acme"]} == {"acme"}
    acme_once = [m for m in got["acme"] if m["timer_id"] == b_once["id"]]
    assert [m["payload"] for m in acme_once] == [{"for": "acme"}]
    # `every 1 s`: four fires, one second apart, each once.
    every = sorted(m["fire_id"] for m in got["acme"] if m["timer_id"] == b_every["id"])
    due = [int(fire_id.rsplit(":", 1)[1]) for fire_id in every]
    assert len(set(every)) == 4
    assert [b - a for a, b in itertools.pairwise(due)] == [1000, 1000, 1000]
    assert all(m["payload"] == [1, 2] for m in got["acme"] if m["timer_id"] == b_every["id"])
    # The API agrees: completed, with the fires recorded.
    status, timer, _ = stack.request("GET", f"/timers/{b_every['id']}", key=b_key)
    assert (status, timer["status"], timer["fire_count"]) == (200, "completed", 4)
    status, fires, _ = stack.request("GET", f"/timers/{a_once['id']}/fires", key=a_key)
    assert [f["status"] for f in fires["items"]] == ["enqueued"]

    # Walled off: the other tenant's timer is 404 on every route, and absent from listings.
    for method, path in [
        ("GET", f"/timers/{a_once['id']}"),
        ("DELETE", f"/timers/{a_once['id']}"),
        ("POST", f"/timers/{a_once['id']}/pause"),
        ("GET", f"/timers/{a_once['id']}/fires"),
    ]:
        status, body, _ = stack.request(method, path, key=b_key)
        assert (status, body["error"]["code"]) == (404, "not_found"), (method, path)
    status, listing, _ = stack.request("GET", "/timers?status=completed", key=b_key)
    assert status == 200
    assert {t["id"] for t in listing["items"]} == {b_once["id"], b_every["id"]}


def test_the_gateway_maps_requests_and_errors_as_an_http_api_does(stack: RunningStack) -> None:
    status, body, headers = stack.request("GET", "/health")
    assert (status, body) == (200, {"status": "ok"})
    assert headers.get("apigw-requestid")
    # Unknown routes and methods reach the function through the $default route, and get the
    # contract's error body; no key is needed to learn that a route does not exist.
    for key in (DEMO_KEY, None):
        status, body, headers = stack.request("GET", "/nope", key=key)
        assert (status, body["error"]["code"]) == (404, "not_found")
        assert "allow" not in headers
        status, body, headers = stack.request("PUT", "/timers", key=key, body={})
        assert (status, body["error"]["code"]) == (405, "method_not_allowed")
        assert headers["allow"] == "GET, POST"
        assert body["error"]["details"] == []
    # Any method reaches the routing: TRACE gets the contract's body, not an HTML 501 page.
    status, body, headers = stack.request("TRACE", "/timers/tmr_x", key=DEMO_KEY)
    assert (status, body["error"]["code"]) == (405, "method_not_allowed"), body
    assert headers["allow"] == "GET, PATCH, DELETE"
    assert headers["content-type"] == "application/json"
    status, body, _ = stack.request("TRACE", "/nope")
    assert (status, body["error"]["code"]) == (404, "not_found"), body
    status, _, headers = stack.request("HEAD", "/health")
    assert (status, headers["allow"]) == (405, "GET")
    # Bad input: the contract's error body, from the function.
    status, body, _ = stack.request("POST", "/timers", key=DEMO_KEY, raw=b"{not json")
    assert (status, body["error"]["code"]) == (400, "validation_error")
    status, body, _ = stack.request("POST", "/timers", key=DEMO_KEY, raw=b"\xff\xfe binary")
    assert (status, body["error"]["code"]) == (400, "validation_error")
    status, body, _ = stack.request("GET", "/timers", key="tk_wrong")
    assert (status, body["error"]["code"]) == (401, "unauthorized")
    # A body that is not JSON is 415 (curl -d without -H sends a form), a body without any
    # Content-Type is read as JSON.
    timer = {"schedule": {"type": "every", "seconds": 3600}, "name": "untyped"}
    for content_type in ("text/plain", "application/x-www-form-urlencoded"):
        status, body, _ = stack.request(
            "POST", "/timers", key=DEMO_KEY, body=timer, content_type=content_type
        )
        assert (status, body["error"]["code"]) == (415, "unsupported_media_type")
        assert "Content-Type: application/json" in body["error"]["message"]
    status, created, _ = stack.request(
        "POST", "/timers", key=DEMO_KEY, body=timer, content_type=None
    )
    assert (status, created["name"]) == (201, "untyped")
    status, body, _ = stack.request(
        "PATCH",
        f"/timers/{created['id']}",
        key=DEMO_KEY,
        body={"name": "changed"},
        content_type="text/plain",
    )
    assert (status, body["error"]["code"]) == (415, "unsupported_media_type")
    status, body, _ = stack.request("GET", f"/timers/{created['id']}", key=DEMO_KEY)
    assert (status, body["name"]) == (200, "untyped")
    # Query strings reach the function: limit=1 pages.
    stack.request("POST", "/timers", key=DEMO_KEY, body=timer)
    status, page, _ = stack.request("GET", "/timers?limit=1&status=active", key=DEMO_KEY)
    assert status == 200 and len(page["items"]) == 1 and page["next_cursor"]
    status, body, _ = stack.request("GET", "/openapi.json")
    assert status == 200 and body["openapi"].startswith("3.")


def test_the_lambda_invoke_api_runs_template_functions(stack: RunningStack) -> None:
    client = boto3.client(
        "lambda",
        endpoint_url=f"http://127.0.0.1:{stack.ports[0]}",
        region_name="us-east-1",
        aws_access_key_id="local",
        aws_secret_access_key="local",
    )
    result = client.invoke(FunctionName="MigratorFunction", Payload=b"{}")
    assert result["StatusCode"] == 200 and "FunctionError" not in result
    assert isinstance(json.loads(result["Payload"].read()), dict)
    # A bad event is the function's error, reported as Lambda reports one.
    result = client.invoke(FunctionName="TriggerFunction", Payload=b'{"bucket": "x"}')
    assert result["FunctionError"] == "Unhandled"
    assert json.loads(result["Payload"].read())["errorType"] == "ValueError"
    assert (
        client.invoke(
            FunctionName="TriggerFunction",
            InvocationType="Event",
            Payload=json.dumps({"bucket": 0}).encode(),
        )["StatusCode"]
        == 202
    )
    with pytest.raises(ClientError) as missing:
        client.invoke(FunctionName="NoSuchFunction", Payload=b"{}")
    assert missing.value.response["Error"]["Code"] == "ResourceNotFoundException"


def test_state_file_is_private(stack: RunningStack) -> None:
    state = Path(stack.env["LOCAL_STATE_DIR"]) / "stack.json"
    assert state.stat().st_mode & 0o077 == 0
    assert json.loads(state.read_text())["demo"]["api_key"] == DEMO_KEY


def test_make_run_delivers_a_signed_webhook_through_the_delivery_queue(
    stack: RunningStack,
) -> None:
    """The trigger puts the fire on the delivery queue; the stack's SQS event source poller
    hands it to the delivery function, which POSTs it here (loopback allowed by the setting)."""
    with webhook_server() as server:
        url = server.on("/hook", 503, 200)  # one retry, then delivered
        status, made, _ = stack.request(
            "POST",
            "/timers",
            key=DEMO_KEY,
            body={
                "schedule": {"type": "after", "seconds": 1},
                "target": {"url": url, "headers": {"X-Test": "e2e"}},
                "payload": {"hello": "webhook"},
            },
        )
        assert status == 201, made
        assert server.wait_for("/hook", 1, DELIVERY_TIMEOUT_S), "no POST arrived"
        first = server.at("/hook")[0]
        _, tenant, _ = stack.request("GET", "/tenant", key=DEMO_KEY)
        body = standardwebhooks.Webhook(tenant["webhook_secret"]).verify(first.body, first.headers)
        assert body["timer_id"] == made["id"] and body["payload"] == {"hello": "webhook"}
        assert first.headers["x-test"] == "e2e"
        # the 503 is retried after its backoff (seconds), then the fire shows delivered
        assert server.wait_for("/hook", 2, DELIVERY_TIMEOUT_S), "the 503 was not retried"
        deadline = time.monotonic() + DELIVERY_TIMEOUT_S
        while time.monotonic() < deadline:
            _, fires, _ = stack.request("GET", f"/timers/{made['id']}/fires", key=DEMO_KEY)
            (fire,) = fires["items"]
            if fire["delivered_at"] is not None:
                break
            time.sleep(0.2)  # the record lands just after the POST's answer
        assert (fire["status"], fire["attempts"], fire["last_status"]) == ("delivered", 2, 200)


def test_without_the_setting_loopback_targets_are_refused(local_stack: RunningStack) -> None:
    key = admin(local_stack, "tenant", "create", "loopback-check")["api_key"]
    status, body, _ = local_stack.request(
        "POST",
        "/timers",
        key=key,
        body={"schedule": {"type": "after", "seconds": 60},
              "target": {"url": "http://127.0.0.1:9/hook"}},
    )  # fmt: skip
    assert status == 400 and body["error"]["code"] == "validation_error"
    assert body["error"]["details"][0]["field"] == "target.url"
    assert "start it with TIMERS_ALLOW_LOOPBACK_TARGETS=1" in body["error"]["message"]


def test_a_failed_webhook_fire_is_found_and_redelivered_with_the_cli(stack: RunningStack) -> None:
    """Issue 20's "done when", from a shell: a fire whose endpoint answers 400 shows in
    ``timers failed``; once the endpoint is fixed, ``timers redeliver`` sends it again with
    the same webhook-id, and it is delivered."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TIMERS_", "AWS_"))}
    env.update(TIMERS_API=stack.api, TIMERS_API_KEY=DEMO_KEY)

    def timers(*args: str) -> Any:
        run = subprocess.run(
            [str(Path(sys.executable).parent / "timers"), "--json", *args],
            env=env, capture_output=True, text=True, timeout=60, cwd="/",
        )  # fmt: skip
        assert run.returncode == 0, run.stderr
        return json.loads(run.stdout)

    with webhook_server() as server:
        url = server.on("/fixed-later", 400, 200)
        made = timers("create", "--in", "1s", "--url", url, "--name", "redeliver-me")
        deadline = time.monotonic() + DELIVERY_TIMEOUT_S
        while time.monotonic() < deadline:
            failed = [f for f in timers("failed")["items"] if f["timer_id"] == made["id"]]
            if failed:
                break
            time.sleep(0.2)
        (fire,) = failed
        assert (fire["reason"], fire["last_status"], fire["redelivered_at"]) == (
            "http 400", 400, None,
        )  # fmt: skip
        (redelivered,) = timers("redeliver", made["id"], fire["fire_id"])["items"]
        assert redelivered["redelivered_at"] is not None
        assert server.wait_for("/fixed-later", 2, DELIVERY_TIMEOUT_S), "not redelivered"
        first, second = server.at("/fixed-later")
        assert first.headers["webhook-id"] == second.headers["webhook-id"] == fire["fire_id"]
        while time.monotonic() < deadline:
            (shown,) = timers("fires", made["id"])["items"]
            if shown["delivered_at"] is not None:
                break
            time.sleep(0.2)  # the record lands just after the POST's answer
        assert (shown["status"], shown["attempts"], shown["last_status"]) == ("delivered", 2, 200)
        # A failure no more: `timers failed` leaves it out, `--all` shows it redelivered.
        assert [f for f in timers("failed")["items"] if f["timer_id"] == made["id"]] == []
        (again,) = [f for f in timers("failed", "--all")["items"] if f["timer_id"] == made["id"]]
        assert again["redelivered_at"] == redelivered["redelivered_at"]

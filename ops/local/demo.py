"""``make demo``: create a few timers on the running local stack and watch their callbacks.

Uses only what a tenant has: the API (with the demo key), the demo callback queue, and - when
the stack allows loopback targets (``TIMERS_ALLOW_LOOPBACK_TARGETS=1 make run``) - a webhook
endpoint of its own on 127.0.0.1, whose POST it verifies with the tenant's secret.
"""

from __future__ import annotations

import json
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import boto3

from ops.local import state
from timers.core.times import format_ms, parse_ms

WAIT_S = 30.0


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _api(base: str, key: str, method: str, path: str, body: Any = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    headers = {"x-api-key": key, "Content-Type": "application/json"}
    request = urllib.request.Request(base + path, data=data, method=method, headers=headers)
    with urllib.request.urlopen(request, timeout=30) as response:
        text = response.read()
    return json.loads(text) if text else None


class WebhookReceiver:
    """A webhook endpoint on 127.0.0.1 that answers 204 and keeps (arrival ms, lower-case
    headers, body) of every POST (also what bench.webhooks measures with)."""

    def __init__(self) -> None:
        self.received: list[tuple[int, dict[str, str], bytes]] = []
        self.arrived = threading.Event()
        hooks = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                arrived = _now_ms()
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                headers = {k.lower(): v for k, v in self.headers.items()}
                hooks.received.append((arrived, headers, body))
                hooks.arrived.set()
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"


def _verify(secret: str, headers: dict[str, str], body: bytes) -> str:
    try:
        import standardwebhooks
    except ImportError:
        return "not checked (pip install standardwebhooks)"
    try:
        standardwebhooks.Webhook(secret).verify(body, headers)
    except standardwebhooks.WebhookVerificationError as exc:
        return f"INVALID ({exc})"
    return "valid (standardwebhooks)"


def webhook_demo(base: str, key: str) -> bool | None:
    """POST a fire to our own endpoint; None when the stack refuses loopback targets."""
    hooks = WebhookReceiver()
    body = {
        "name": "webhook after 1 s",
        "schedule": {"type": "after", "seconds": 1},
        "target": {"url": hooks.url, "headers": {"X-Demo": "yes"}},
        "payload": {"demo": "webhook"},
    }
    try:
        created = _api(base, key, "POST", "/timers", body)
    except urllib.error.HTTPError as exc:
        if exc.code == 400:
            print(
                "\nwebhook demo skipped: the stack refuses loopback targets; start it with"
                " `TIMERS_ALLOW_LOOPBACK_TARGETS=1 make run` to see one arrive"
            )
            return None
        raise
    secret = _api(base, key, "GET", "/tenant")["webhook_secret"]
    print(f"\ncreated {created['id']}  {'webhook after 1 s':<20} POST to {hooks.url}")
    if not hooks.arrived.wait(WAIT_S):
        print("no webhook arrived")
        return False
    _, headers, raw = hooks.received[0]
    sent = json.loads(raw)
    lag = _now_ms() - parse_ms(sent["scheduled_at"])
    print(
        f"webhook   {sent['name']:<20} scheduled {sent['scheduled_at']}  received ~{lag} ms"
        f" after; webhook-id {headers.get('webhook-id')}"
    )
    print(f"          signature {_verify(secret, headers, raw)}; X-Demo: {headers.get('x-demo')}")
    time.sleep(0.5)  # let the delivery record land
    (fire,) = _api(base, key, "GET", f"/timers/{created['id']}/fires")["items"]
    print(
        f"          fire history: status {fire['status']}, attempts {fire['attempts']},"
        f" last_status {fire['last_status']}, delivered_at {fire['delivered_at']}"
    )
    hooks.server.shutdown()
    return True


def main() -> int:
    running = state.read()
    if running is None:
        print("no local stack is running: start one with `make run` in another terminal")
        return 1
    base, key = running["api_url"], running["demo"]["api_key"]
    queue_url = running["demo"]["callback_queue_url"]
    sqs = boto3.client(
        "sqs",
        endpoint_url=running["aws_endpoint"],
        region_name="us-east-1",
        aws_access_key_id="local",
        aws_secret_access_key="local",
    )
    start = _now_ms()
    timers: list[dict[str, Any]] = [
        {"name": "after 1 s", "schedule": {"type": "after", "seconds": 1}},
        {"name": "at +3 s", "schedule": {"type": "at", "at": format_ms(start + 3_000)}},
        {"name": "every 2 s, 3 times", "schedule": {"type": "every", "seconds": 2}, "max_fires": 3},
    ]
    for timer in timers:
        created = _api(base, key, "POST", "/timers", {**timer, "payload": {"demo": True}})
        print(f"created {created['id']}  {timer['name']:<20} next fire {created['next_fire_at']}")
    doomed = {"name": "cancelled", "schedule": {"type": "after", "seconds": 2}}
    cancelled = _api(base, key, "POST", "/timers", doomed)
    _api(base, key, "DELETE", f"/timers/{cancelled['id']}")
    print(f"created {cancelled['id']}  {'cancelled':<20} and deleted it: it must never fire")
    print("\nwaiting for callbacks on", queue_url)

    expected = 5
    lags: list[int] = []
    seen: set[str] = set()
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline and (len(lags) < expected or _now_ms() < start + 7_000):
        reply = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=1)
        for message in reply.get("Messages", []):
            body = json.loads(message["Body"])
            sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=message["ReceiptHandle"])
            if body["fire_id"] in seen:
                continue
            seen.add(body["fire_id"])
            lag = parse_ms(body["fired_at"]) - parse_ms(body["scheduled_at"])
            lags.append(lag)
            marker = "  <- cancelled timer fired!" if body["timer_id"] == cancelled["id"] else ""
            print(
                f"callback  {body['name'] or '':<20} scheduled {body['scheduled_at']}"
                f"  fired {body['fired_at']}  lag {lag:>4} ms{marker}"
            )
    lags.sort()
    early = sum(1 for lag in lags if lag < 0)
    print(
        f"\n{len(lags)} of {expected} callbacks; lag min {lags[0] if lags else '-'} ms,"
        f" max {lags[-1] if lags else '-'} ms; {early} early"
    )
    webhook = webhook_demo(base, key)
    return 0 if len(lags) == expected and early == 0 and webhook is not False else 1


if __name__ == "__main__":
    sys.exit(main())

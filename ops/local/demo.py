"""``make demo``: create a few timers on the running local stack and watch their callbacks.

Uses only what a tenant has: the API (with the demo key) and the demo callback queue.
"""

from __future__ import annotations

import json
import sys
import time
import urllib.request
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
    return 0 if len(lags) == expected and early == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

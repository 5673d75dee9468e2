"""Webhook lag on the local stack: due time -> POST received, at a steady load.

``python -m bench.webhooks`` (``QUICK=1``: a shorter window) starts ``python -m ops.local``
with ``TIMERS_ALLOW_LOOPBACK_TARGETS=1`` on free ports, serves a webhook endpoint on
127.0.0.1, creates ``every 1 s`` timers targeting it (each with its own sub-second phase) and,
after a warm-up, counts every fire *scheduled* in a window: the lag from the due time to the
POST's arrival (trigger -> delivery queue -> the stack's SQS event source poller -> the
delivery function -> here), duplicates (by ``webhook-id``), missing fires and signatures that
do not verify. Writes the ``webhooks`` section of bench/results/latest.json.
"""

from __future__ import annotations

import json
import random
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import standardwebhooks

from bench.common import progress, quick, write_results
from bench.e2e import lag_stats, now_ms
from ops.local.demo import WebhookReceiver
from tests.support.local_stack import start_stack
from timers.core.times import format_ms, parse_ms

TIMERS = 10
WARM_UP_S = 15


def _verifies(secret: standardwebhooks.Webhook, headers: dict[str, str], body: bytes) -> bool:
    try:
        secret.verify(body, headers)
    except Exception:  # a missing header as much as a wrong signature
        return False
    return True


def main() -> int:
    window_s = 20 if quick() else 60
    endpoint = WebhookReceiver()
    with tempfile.TemporaryDirectory(prefix="bench-webhooks-") as state_dir:
        stack = start_stack(Path(state_dir), TIMERS_ALLOW_LOOPBACK_TARGETS="1")
        try:
            stack.wait_ready()
            key = stack.ready["Tenant demo API key: "]
            status, tenant, _ = stack.request("GET", "/tenant", key=key)
            assert status == 200, tenant
            secret = standardwebhooks.Webhook(tenant["webhook_secret"])
            first = (now_ms() // 1000 + 3) * 1000
            phases = sorted(random.Random(13).sample(range(1000), TIMERS))
            timers = [
                {
                    "schedule": {"type": "every", "seconds": 1},
                    "start_at": format_ms(first + p),
                    "target": {"url": endpoint.url},
                    "payload": {"bench": "webhooks"},
                }
                for p in phases
            ]
            status, made, _ = stack.request("POST", "/timers:batch", key=key,
                                            body={"timers": timers})  # fmt: skip
            assert status == 201, made
            progress(f"webhooks: {TIMERS} timers every 1 s -> {endpoint.url}, {window_s} s window")
            start = (now_ms() // 1000 + WARM_UP_S) * 1000
            time.sleep((start - now_ms()) / 1000)
            time.sleep(window_s)
            end = start + window_s * 1000
            time.sleep(5)  # what is due in the window has arrived by now, or it is late
            for timer in made["items"]:
                stack.request("DELETE", f"/timers/{timer['id']}", key=key)
        finally:
            stack.stop()
    arrivals = [
        (
            headers["webhook-id"],
            parse_ms(json.loads(body)["scheduled_at"]),
            arrived,
            _verifies(secret, headers, body),
        )
        for arrived, headers, body in endpoint.received
    ]
    arrivals = [a for a in arrivals if start <= a[1] < end]
    counts = Counter(a[0] for a in arrivals)
    firsts: dict[str, tuple[str, int, int, bool]] = {}
    for arrival in sorted(arrivals, key=lambda a: a[2]):
        firsts.setdefault(arrival[0], arrival)
    expected = TIMERS * window_s
    out: dict[str, Any] = {
        "quick": quick(),
        "timers": TIMERS,
        "window_s": window_s,
        "fires": len(firsts),
        "expected": expected,
        "missing": expected - len(firsts),
        "duplicates": sum(n - 1 for n in counts.values()),
        "early": sum(1 for _, scheduled, arrived, _ in firsts.values() if arrived < scheduled),
        "invalid_signatures": sum(1 for a in arrivals if not a[3]),
        "received_lag_ms": lag_stats([arrived - s for _, s, arrived, _ in firsts.values()]),
    }
    path = write_results("webhooks", out)
    progress(f"webhooks: due -> POST received {out['received_lag_ms']} -> {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

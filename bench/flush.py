"""Issue 16's scenario on ``make run``: a Redis flush after later work was swept loses nothing.

``python -m bench.flush`` (``QUICK=1``: one round, else three) starts the local stack as a
user does and, per round, through the public API only:

1. creates 250 one-shots due in three minutes (a batch create);
2. waits until the migrator has swept up to them (its run after they came inside the 120 s
   look-ahead: 70 s);
3. creates 15 one-shots due in 25 s, one request each, and PATCHes 5 of them to 30 s;
4. ``FLUSHALL``s the stack's Redis (a failover to an empty replica);
5. waits until every one of them is due, plus the migrator's next minute, and counts the
   callbacks that reached the demo tenant's queue.

The first fire path lost 2 of the 15 here (one-shots read from a watermark that had passed
them). Every callback is checked for duplicates and for being early; ``sent_lag_ms`` is SQS
``SentTimestamp`` - due (the 15 were due while Redis was empty: late by up to the migrator's
next run, never lost).
"""

from __future__ import annotations

import time
from typing import Any

import redis

from bench.common import progress, quick, write_results
from bench.e2e import demo_tenant, lag_stats, local_stack, now_ms
from timers.core.times import format_ms

FAR, NEAR, MOVED = 250, 15, 5
FAR_IN_S, NEAR_IN_S, MOVED_TO_S = 180, 25, 30
SWEPT_AFTER_S = 70  # the far ones are inside the look-ahead after 60 s; the minute's run sweeps
SETTLE_S = 100  # the migrator's next run restores what the flush lost, the trigger fires it


def one_round(stack: Any, tenant: Any) -> dict[str, Any]:
    start = now_ms()
    due = format_ms(start + FAR_IN_S * 1000)
    far = tenant.create_batch([{"schedule": {"type": "at", "at": due}, "payload": i}
                               for i in range(FAR)])  # fmt: skip
    progress(f"flush: {FAR} one-shots due in {FAR_IN_S} s; waiting for the migrator's sweep")
    time.sleep(SWEPT_AFTER_S)
    near = [tenant.call("POST", "/timers", {"schedule": {"type": "after", "seconds": NEAR_IN_S},
                                            "payload": {"near": i}})["id"]
            for i in range(NEAR)]  # fmt: skip
    for timer_id in near[:MOVED]:
        tenant.call("PATCH", f"/timers/{timer_id}",
                    {"schedule": {"type": "after", "seconds": MOVED_TO_S}})  # fmt: skip
    redis.Redis(port=int(stack.env["REDIS_PORT"])).flushall()
    progress(f"flush: {NEAR} one-shots due in {NEAR_IN_S}-{MOVED_TO_S} s, then FLUSHALL")
    time.sleep(max(0.0, (start + FAR_IN_S * 1000 - now_ms()) / 1000) + SETTLE_S)
    near_got, near_dup = tenant.consumer.of(set(near))
    far_got, far_dup = tenant.consumer.of(set(far))
    every = near_got + far_got
    result = {
        "near_lost": NEAR - len({c.timer_id for c in near_got}),
        "far_lost": FAR - len({c.timer_id for c in far_got}),
        "duplicates": near_dup + far_dup,
        "early": sum(1 for c in every if min(c.fired, c.sent) < c.scheduled),
        "near_sent_lag_ms": lag_stats([c.sent - c.scheduled for c in near_got]),
        "far_sent_lag_ms": lag_stats([c.sent - c.scheduled for c in far_got]),
    }
    progress(f"flush: {result}")
    return result


def main() -> int:
    rounds = 1 if quick() else 3
    results = []
    with local_stack("flush") as stack:
        tenant = demo_tenant(stack)
        for n in range(rounds):
            progress(f"flush: round {n + 1} of {rounds}")
            results.append(one_round(stack, tenant))
        tenant.consumer.stop()
    lost = sum(r["near_lost"] + r["far_lost"] for r in results)
    out = {
        "rounds": results,
        "lost": lost,
        "duplicates": sum(r["duplicates"] for r in results),
        "early": sum(r["early"] for r in results),
        "what": f"{FAR} one-shots due in {FAR_IN_S} s swept by the migrator, then {NEAR} due in "
        f"{NEAR_IN_S} s ({MOVED} PATCHed to {MOVED_TO_S} s), then FLUSHALL: callbacks counted",
        "rerun": "python -m bench.flush (QUICK=1: one round)",
    }
    write_results("flush", out)
    print(f"flush: {rounds} rounds, {lost} lost, {out['duplicates']} duplicates, "
          f"{out['early']} early")  # fmt: skip
    return 1 if lost or out["early"] else 0


if __name__ == "__main__":
    raise SystemExit(main())

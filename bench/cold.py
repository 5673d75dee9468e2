"""The cold second: the first fires after idle, on the local stack (``e2e.cold``).

``python -m bench.cold`` (``QUICK=1``: two rounds instead of three) starts ``python -m
ops.local`` with ``LOCAL_LAMBDA_IDLE_S`` short, so idle sandboxes retire as Lambda's do. Each
round waits until nothing has run for longer than both that idle time and the fan-out's
``COLD_AFTER_MS`` (so the trigger's sandboxes are gone and the fan-out knows it), wakes the api
with one request (its cold start is not what is measured), then creates a few one-shots due
a few seconds later at scattered phases, and reads their callbacks: sent lag (SQS
``SentTimestamp`` - due), early, duplicates, missing; and the trigger runs' invoke delays (a
cold start shows there). Results merge into ``bench/results/latest.json`` under ``e2e.cold``.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any

from bench.common import last_results, progress, quick, write_results
from bench.e2e import at, demo_tenant, lag_stats, local_stack, now_ms, runs_between, summary
from bench.e2e import trigger_runs as runs_so_far
from tests.support.local_stack import RunningStack, descendants

IDLE_S = 20  # LOCAL_LAMBDA_IDLE_S for this stack
QUIET_S = 75  # per round: > IDLE_S and > the fan-out's COLD_AFTER_MS (60 s), with margin
TIMERS = 4  # per round
DUE_IN_S = 4  # after the create: the api is warm by then, the fan-out's lead is not
ROUNDS, QUICK_ROUNDS = 3, 2


def sandboxes(stack: RunningStack) -> int:
    """Sandbox processes alive under the stack (every function's; the fan-out's is busy)."""
    count = 0
    for pid in descendants(stack.process.pid):
        try:
            if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes():
                count += 1
        except OSError:
            continue
    return count


def one_round(stack: RunningStack, n: int, rng: random.Random) -> dict[str, Any]:
    a = demo_tenant(stack)
    before = sandboxes(stack)
    a.call("GET", "/tenant")  # the api starts cold here, not during the create
    runs0 = runs_so_far(stack)
    base = (now_ms() // 1000 + DUE_IN_S) * 1000
    ids = {a.call("POST", "/timers", at(base + rng.randrange(1000)))["id"] for _ in range(n)}
    deadline = time.monotonic() + DUE_IN_S + 30
    while len(a.consumer.of(ids)[0]) < n and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(2)  # a duplicate would arrive by now
    callbacks, duplicates = a.consumer.of(ids)
    a.consumer.stop()
    runs = runs_between(runs0, runs_so_far(stack))
    return {
        "sandboxes_alive_before": before,
        **summary(callbacks, duplicates, n),
        "sent_lags": sorted(c.sent - c.scheduled for c in callbacks),
        "trigger_runs": runs["runs"],
        "trigger_invoke_delay_ms": runs["invoke_delay_ms"],
    }


def main() -> int:
    rounds = QUICK_ROUNDS if quick() else ROUNDS
    rng = random.Random(5)
    out: dict[str, Any] = {"idle_s": IDLE_S, "quiet_s": QUIET_S, "timers_per_round": TIMERS}
    with local_stack("cold", LOCAL_LAMBDA_IDLE_S=str(IDLE_S)) as stack:
        done = []
        for r in range(rounds):
            progress(f"e2e.cold: round {r + 1}/{rounds}: {QUIET_S} s quiet, sandboxes retire")
            time.sleep(QUIET_S)
            done.append(one_round(stack, TIMERS, rng))
            progress(f"e2e.cold: round {r + 1}: sent lags {done[-1]['sent_lags']} ms")
    lags = [lag for d in done for lag in d["sent_lags"]]
    out |= {
        "rounds": done,
        "fires": len(lags),
        "expected": rounds * TIMERS,
        "early": sum(d["early"] for d in done),
        "duplicates": sum(d["duplicates"] for d in done),
        "missing": sum(d["missing"] for d in done),
        "sent_lag_ms": lag_stats(lags),
        "rerun": "python -m bench.cold" + (" (QUICK=1)" if quick() else ""),
    }
    e2e = last_results("e2e")
    path = write_results("e2e", {**e2e, "cold": out})
    print(json.dumps({k: v for k, v in out.items() if k != "rounds"}, indent=1))
    print(f"written to {path} (e2e.cold); rerun: {out['rerun']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

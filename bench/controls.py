"""The tenant's controls on the local stack (``make run``): reset precision and run-now latency,
measured where a tenant sees them - SQS ``SentTimestamp`` on its callback queue.

``python -m bench.controls`` (``QUICK=1``: fewer timers) starts ``python -m ops.local`` on free
ports and, over HTTP:

- **reset** - ``RESET_TIMERS`` timers ``after 2 s``, each reset every 0.5 s for 5 s (sessions
  kept alive, ``WAVE`` at once), then left alone: each must fire once, 2 s after its last reset. Lag
  is ``SentTimestamp`` - the ``next_fire_at`` the last reset answered; also ``SentTimestamp`` -
  (the time that answer arrived + 2 s), which a client can check with no clock of ours. A
  callback of a schedule a reset replaced, sent after that reset answered, is ``stale`` (the
  contract: never); one sent before it is not a fault (it fired before the reset).
- **run now** - ``RUN_TIMERS`` timers ``every 3600 s``, each run now once, spaced: latency is
  ``SentTimestamp`` - the time the request was sent, and - the answer's arrival (negative: the
  callback was on the queue before the answer came back, as the api enqueues before it answers).

The stack and this benchmark share one clock, so each figure is exact to the millisecond.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

from bench.common import progress, quick, write_results
from bench.e2e import Tenant, demo_tenant, lag_stats, local_stack, now_ms, wait_for
from timers.core.times import parse_ms

RESET_TIMERS = 40
WAVE = 8
RESETS_EACH = 10
RESET_EVERY_S = 0.5
AFTER_S = 2
RUN_TIMERS = 60
RUN_SPACING_S = 0.25


def fired_all(a: Tenant, ids: set[str]) -> bool:
    return len(a.consumer.of(ids)[0]) >= len(ids)


def resets(a: Tenant, count: int) -> dict[str, Any]:
    made: dict[str, int] = {}  # timer -> the schedule it was created with
    # per timer: (the schedule a reset replaced, when its answer arrived, the new schedule)
    replaced: dict[str, list[tuple[int, int, int]]] = {}
    answer_ms: list[int] = []

    def keep_alive(timer_id: str) -> None:
        schedule = made[timer_id]
        for _ in range(RESETS_EACH):
            sent = now_ms()
            reply = a.call("POST", f"/timers/{timer_id}/reset")
            arrived = now_ms()
            answer_ms.append(arrived - sent)
            replaced[timer_id].append((schedule, arrived, parse_ms(reply["next_fire_at"])))
            schedule = parse_ms(reply["next_fire_at"])
            time.sleep(RESET_EVERY_S)

    for start in range(0, count, WAVE):  # WAVE sessions at once: the local api has 4 sandboxes
        wave = []
        for _ in range(min(WAVE, count - start)):
            reply = a.call("POST", "/timers", {"schedule": {"type": "after", "seconds": AFTER_S}})
            made[reply["id"]] = parse_ms(reply["next_fire_at"])
            replaced[reply["id"]] = []
            wave.append(reply["id"])
        with ThreadPoolExecutor(len(wave)) as pool:
            list(pool.map(keep_alive, wave))
        wait_for(partial(fired_all, a, set(wave)), AFTER_S + 20)
    last = {t: r[-1] for t, r in replaced.items()}
    time.sleep(2)  # anything late or stale arrives too
    callbacks, duplicates = a.consumer.of(set(made))
    finals = {c.timer_id: c for c in callbacks if c.scheduled == last[c.timer_id][2]}
    # a schedule a reset replaced may fire only before that reset answered
    before = [c for c in callbacks for old, arrived, _ in replaced[c.timer_id]
              if c.scheduled == old and c.sent <= arrived]  # fmt: skip
    stale = [c for c in callbacks for old, arrived, _ in replaced[c.timer_id]
             if c.scheduled == old and c.sent > arrived]  # fmt: skip
    lags = [c.sent - last[t][2] for t, c in finals.items()]
    after_answer = [c.sent - (last[t][1] + AFTER_S * 1000) for t, c in finals.items()]
    return {
        "timers": count,
        "resets": count * RESETS_EACH,
        "fired": len(finals),
        "missing": count - len(finals),
        "stale": len(stale),
        "fired_before_a_reset_answered": len(before),
        "duplicates": duplicates,
        "early": sum(lag < 0 for lag in lags),
        "sent_lag_ms": lag_stats(lags),
        "sent_minus_answer_plus_2s_ms": lag_stats(after_answer),
        "reset_answer_ms": lag_stats(answer_ms),
    }


def runs_now(a: Tenant, count: int) -> dict[str, Any]:
    ids = [a.call("POST", "/timers", {"schedule": {"type": "every", "seconds": 3600}})["id"]
           for _ in range(count)]  # fmt: skip
    asked: dict[str, tuple[int, int, str]] = {}  # timer -> (request sent, answer, fire id)
    for timer_id in ids:
        sent = now_ms()
        reply = a.call("POST", f"/timers/{timer_id}/run")
        asked[timer_id] = (sent, now_ms(), reply["fire_id"])
        time.sleep(RUN_SPACING_S)
    wait_for(lambda: len(a.consumer.of(set(ids))[0]) >= count, 20)
    callbacks, duplicates = a.consumer.of(set(ids))
    by_fire = {f"{c.timer_id}:{c.scheduled}": c for c in callbacks}
    got = {t: by_fire[f] for t, (_, _, f) in asked.items() if f in by_fire}
    return {
        "runs": count,
        "enqueued": len(got),
        "missing": count - len(got),
        "duplicates": duplicates,
        "early": sum(c.sent < c.scheduled for c in got.values()),
        "request_to_sent_ms": lag_stats([c.sent - asked[t][0] for t, c in got.items()]),
        "answer_to_sent_ms": lag_stats([c.sent - asked[t][1] for t, c in got.items()]),
        "request_ms": lag_stats([asked[t][1] - asked[t][0] for t in asked]),
    }


def main() -> int:
    short = quick()
    out: dict[str, Any] = {"quick": short}
    with local_stack("controls") as stack:
        a = demo_tenant(stack)
        progress("controls: warming the stack's sandboxes")
        resets(a, 8)  # the first calls start sandboxes: not measured
        progress("controls: resets")
        out["reset"] = resets(a, RESET_TIMERS // (2 if short else 1))
        progress(f"controls: {out['reset']}")
        progress("controls: run now")
        out["run_now"] = runs_now(a, RUN_TIMERS // (2 if short else 1))
        progress(f"controls: {out['run_now']}")
        a.consumer.stop()
    out["rerun"] = "make bench" + (" QUICK=1" if short else "") + "  (or python -m bench.controls)"
    path = write_results("controls", out)
    print(json.dumps({k: v for k, v in out.items() if k != "rerun"}, indent=1))
    print(f"written to {path}; rerun: {out['rerun']}")
    ok = all(out[s]["missing"] == 0 and out[s]["early"] == 0 for s in ("reset", "run_now"))
    return 0 if ok and out["reset"]["stale"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""End-to-end benchmark: callback lag on the local stack (``make run``), as a tenant sees it.

``python -m bench.e2e`` (``QUICK=1``: shorter windows, no 10,000 burst) starts
``python -m ops.local`` on free ports, as a user does, and reads the tenants' callback queues
(long-polling receivers, ``SentTimestamp`` asked for). Timers are created over HTTP.

- **steady** - 20 timers ``every 1 s``, each with its own sub-second phase, made by one batch
  create; after a warm-up, every fire *scheduled* in a window is counted: lag of ``fired_at``
  (the trigger's stamp just before its SendMessageBatch), of SQS ``SentTimestamp`` (what any
  consumer can see) and of the receive time; early, duplicate and missing fires; trigger runs
  per fire (the "trigger run" lines of the TriggerFunction log).
- **windowed** - the steady load with ``window_seconds`` 10 (every 2 s): lag from the nominal
  due time, fires outside their window (must be none), sends per trigger run.
- **spaced** - one-shots created one by one, 1.5 s apart at random phases: max lag.
- **fairness** - tenant A (demo) makes 300 one-shots due in one second, tenant B (a second
  tenant) one in the same second: B's lag while A's burst drains.
- **bursts** - 1,000 (and 10,000) one-shots due in one second, 100 per batch create: drain time
  (last ``fired_at`` - due), duplicates, missing, and moto's share of the stack's CPU meanwhile.
- **cold** - the first fires after idle: ``bench.cold`` (its own stack, short idle time); this
  module keeps its last result.

The stack and this benchmark share one clock, so a lag is exact to the millisecond; what AWS
adds (asynchronous invoke, the SQS round trip) is in docs/capacity.md.
"""

from __future__ import annotations

import json
import random
import shutil
import sys
import tempfile
import threading
import time
import zlib
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3

from bench.common import last_results, progress, quick, write_results
from tests.support.local_stack import RunningStack, admin, descendants, start_stack
from timers.core.times import format_ms, parse_ms
from timers.engine.entries import PARTITIONS

STEADY_TIMERS = 20
FRESH_FROM_S = 5  # a fresh stack's steady lag is counted from this long after the first fire
WARM_UP_S = 15  # the local runtime starts sandboxes on demand, in seconds each on 2 busy cores
BATCH = 100  # timers per POST /v1/timers:batch
CREATE_THREADS = 4  # batch creates in flight (the stack's api has 4 sandboxes)
RUN_COUNTS = ("ambiguous", "unrecorded", "handed_back", "refused", "held", "reclaimed", "failed")
LOGS = Path(__file__).resolve().parent / "results" / "logs"  # the last run's stack logs
DRAIN_WAIT_S = 600  # a burst that has not drained by then is reported as not drained
HOT_AHEAD_S = 75  # the hot second's timers are created this far ahead of their due time
BURST_SANDBOXES = "2"  # per function, for bursts: fewer calls in flight keep moto's queues short


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def pct(values: Sequence[int], p: float) -> int | None:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))] if ordered else None


def lag_stats(lags: Sequence[int]) -> dict[str, int | None]:
    return {"p50": pct(lags, 50), "p90": pct(lags, 90), "p99": pct(lags, 99),
            "max": max(lags, default=None)}  # fmt: skip


@dataclass(frozen=True)
class Callback:
    timer_id: str
    scheduled: int
    fired: int  # the trigger's fired_at
    sent: int  # SQS SentTimestamp
    received: int


class Consumer:
    """Long-polling receivers on one queue; every message kept by fire id and MessageId."""

    def __init__(self, endpoint: str, queue_url: str, receivers: int = 3) -> None:
        self.queue_url = queue_url
        self.by_fire: dict[str, dict[str, Callback]] = defaultdict(dict)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._sqs = boto3.client(
            "sqs", endpoint_url=endpoint, region_name="us-east-1",
            aws_access_key_id="local", aws_secret_access_key="local",
        )  # fmt: skip
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(receivers)]
        for thread in self._threads:
            thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                got = self._sqs.receive_message(
                    QueueUrl=self.queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=1,
                    MessageSystemAttributeNames=["SentTimestamp"],
                ).get("Messages", [])  # fmt: skip
            except Exception:  # the stack stopping under us
                self._stop.wait(0.2)
                continue
            received = now_ms()
            for m in got:
                body = json.loads(m["Body"])
                callback = Callback(body["timer_id"], parse_ms(body["scheduled_at"]),
                                    parse_ms(body["fired_at"]),
                                    int(m["Attributes"]["SentTimestamp"]), received)  # fmt: skip
                with self._lock:
                    self.by_fire[body["fire_id"]].setdefault(m["MessageId"], callback)
            if got:
                entries: Any = [{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]}
                           for i, m in enumerate(got)]  # fmt: skip
                try:
                    self._sqs.delete_message_batch(QueueUrl=self.queue_url, Entries=entries)
                except Exception:  # a busy moto: they come back, and are kept once by MessageId
                    self._stop.wait(0.2)

    def of(self, timer_ids: set[str]) -> tuple[list[Callback], int]:
        """The first callback of each fire of these timers, and the extra sends (duplicates)."""
        with self._lock:
            sends = [list(s.values()) for s in self.by_fire.values() if
                     next(iter(s.values())).timer_id in timer_ids]  # fmt: skip
        firsts = [min(s, key=lambda c: c.received) for s in sends]
        return firsts, sum(len(s) - 1 for s in sends)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(5)


class Tenant:
    def __init__(self, stack: RunningStack, key: str, queue_url: str) -> None:
        self.stack, self.key = stack, key
        self.consumer = Consumer(stack.aws_endpoint, queue_url)

    def call(self, method: str, path: str, body: Any = None) -> Any:
        for _ in range(50):
            status, reply, headers = self.stack.request(method, path, key=self.key, body=body)
            code = (reply or {}).get("error", {}).get("code") if status >= 400 else None
            if status == 429:
                time.sleep(float(headers.get("retry-after", 1)))
            elif code == "concurrent_update":  # its fire was being claimed: the API says retry
                time.sleep(0.2)
            else:
                break
        if status >= 300:
            raise RuntimeError(f"{method} {path}: {status} {reply}")
        return reply

    def create_batch(self, timers: list[dict[str, Any]]) -> list[str]:
        chunks = [timers[i : i + BATCH] for i in range(0, len(timers), BATCH)]
        with ThreadPoolExecutor(CREATE_THREADS) as pool:
            replies = pool.map(lambda c: self.call("POST", "/timers:batch", {"timers": c}),
                               chunks)  # fmt: skip
            return [t["id"] for reply in replies for t in reply["items"]]


def at(ms: int) -> dict[str, Any]:
    return {"schedule": {"type": "at", "at": format_ms(ms)}, "payload": {"bench": True}}


def summary(callbacks: list[Callback], duplicates: int, expected: int) -> dict[str, Any]:
    fired = [c.fired - c.scheduled for c in callbacks]
    return {
        "fires": len(callbacks),
        "expected": expected,
        "missing": expected - len(callbacks),
        "duplicates": duplicates,
        "early": sum(1 for c in callbacks if min(c.fired, c.sent) < c.scheduled),
        "fired_at_lag_ms": lag_stats(fired),
        "sent_lag_ms": lag_stats([c.sent - c.scheduled for c in callbacks]),
        "receive_lag_ms": lag_stats([c.received - c.scheduled for c in callbacks]),
    }


# ---------------------------------------------------------------- what the stack did meanwhile


def trigger_runs(stack: RunningStack) -> dict[str, Any]:
    """What the trigger's runs so far did, from its one log line per run."""
    log = Path(stack.env["LOCAL_STATE_DIR"], "logs", "TriggerFunction.log")
    runs = [json.loads(line) for line in log.read_text(errors="replace").splitlines()
            if '"trigger run"' in line] if log.exists() else []  # fmt: skip
    totals = {k: sum(r.get(k, 0) for r in runs) for k in RUN_COUNTS}
    delays = [r["invoke_delay_ms"] for r in runs if r.get("invoke_delay_ms") is not None]
    return {"runs": len(runs), "runs_that_leased_nothing": sum(not r.get("leased") for r in runs),
            **totals, "delays": delays}  # fmt: skip


def runs_between(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    out = {k: after[k] - before[k] for k in after if k != "delays"}
    out["invoke_delay_ms"] = lag_stats(after["delays"][len(before["delays"]) :])
    return out


def cpu_seconds(stack: RunningStack) -> dict[str, float]:
    """CPU seconds so far of moto and of the whole stack (every process below it, and it)."""
    out = {"moto": 0.0, "stack": 0.0}
    for pid in {stack.process.pid, *descendants(stack.process.pid)}:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        seconds = (int(fields[11]) + int(fields[12])) / 100  # utime + stime, clock ticks
        out["stack"] += seconds
        if b"moto.server" in cmdline or b"moto_server" in cmdline:
            out["moto"] += seconds
    return out


def wait_for(done: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


# ---------------------------------------------------------------- scenarios


def steady(a: Tenant, window_s: int) -> dict[str, Any]:
    first = (now_ms() // 1000 + 3) * 1000
    phases = sorted(random.Random(7).sample(range(1000), STEADY_TIMERS))
    ids = a.create_batch([{"schedule": {"type": "every", "seconds": 1},
                           "start_at": format_ms(first + p), "payload": {"bench": True}}
                          for p in phases])  # fmt: skip
    start = (now_ms() // 1000 + WARM_UP_S) * 1000  # sandboxes start cold: warm them first
    time.sleep((start - now_ms()) / 1000)
    runs0 = trigger_runs(a.stack)
    time.sleep(window_s)
    runs1 = trigger_runs(a.stack)
    end = start + window_s * 1000
    time.sleep(3)
    callbacks, duplicates = a.consumer.of(set(ids))
    in_window = [c for c in callbacks if start <= c.scheduled < end]
    for timer_id in ids:
        a.call("DELETE", f"/timers/{timer_id}")
    runs = runs_between(runs0, runs1)
    return {
        "timers": STEADY_TIMERS,
        "window_s": window_s,
        **summary(in_window, duplicates, STEADY_TIMERS * window_s),
        "invocations_per_fire": round(runs["runs"] / max(1, len(in_window)), 3),
        "trigger": runs,
    }


def fresh(a: Tenant, window_s: int) -> dict[str, Any]:
    """The steady load on a stack that has just started, as a user first meets it: no warm-up,
    sandboxes started as the load needs them. Counted from FRESH_FROM_S after the first due
    time; the first fire of each timer is counted apart (the cold path)."""
    first = (now_ms() // 1000 + 3) * 1000
    phases = sorted(random.Random(7).sample(range(1000), STEADY_TIMERS))
    ids = a.create_batch([{"schedule": {"type": "every", "seconds": 1},
                           "start_at": format_ms(first + p), "payload": {"bench": True}}
                          for p in phases])  # fmt: skip
    start, end = first + FRESH_FROM_S * 1000, first + (FRESH_FROM_S + window_s) * 1000
    time.sleep(max(0.0, (start - now_ms()) / 1000))
    runs0 = trigger_runs(a.stack)
    time.sleep(max(0.0, (end - now_ms()) / 1000))
    runs1 = trigger_runs(a.stack)
    time.sleep(3)
    callbacks, duplicates = a.consumer.of(set(ids))
    for timer_id in ids:
        a.call("DELETE", f"/timers/{timer_id}")
    firsts = [c for c in callbacks if c.scheduled < first + 1000]
    in_window = [c for c in callbacks if start <= c.scheduled < end]
    runs = runs_between(runs0, runs1)
    return {
        "timers": STEADY_TIMERS,
        "from_s": FRESH_FROM_S,
        "window_s": window_s,
        **summary(in_window, duplicates, STEADY_TIMERS * window_s),
        "first_fires": summary(firsts, 0, STEADY_TIMERS),
        "late_over_100ms": sorted(lag for c in in_window if (lag := c.sent - c.scheduled) > 100),
        "invocations_per_fire": round(runs["runs"] / max(1, len(in_window)), 3),
        "trigger": runs,
    }


WINDOWED_S = 10  # window_seconds of the windowed scenario: fires aligned to 5 s instants
WINDOWED_EVERY_S = 2


def windowed(a: Tenant, window_s: int) -> dict[str, Any]:
    """The steady load with a flexible window: STEADY_TIMERS timers every WINDOWED_EVERY_S at
    scattered phases, window_seconds WINDOWED_S. Lag is from the nominal due time (the fire
    id's); every fire must land in [due, due + window] on a quiet stack."""
    runs0 = trigger_runs(a.stack)
    first = (now_ms() // 1000 + 3) * 1000
    phases = sorted(random.Random(5).sample(range(WINDOWED_EVERY_S * 1000), STEADY_TIMERS))
    ids = a.create_batch([{"schedule": {"type": "every", "seconds": WINDOWED_EVERY_S},
                           "start_at": format_ms(first + p), "window_seconds": WINDOWED_S,
                           "payload": {"bench": True}} for p in phases])  # fmt: skip
    start = first + 2 * WINDOWED_S * 1000  # past the first aligned instants
    end = start + window_s * 1000
    time.sleep(max(0.0, (end + WINDOWED_S * 1000 - now_ms()) / 1000))
    runs = runs_between(runs0, trigger_runs(a.stack))
    time.sleep(3)
    callbacks, duplicates = a.consumer.of(set(ids))
    for timer_id in ids:
        a.call("DELETE", f"/timers/{timer_id}")
    in_window = [c for c in callbacks if start <= c.scheduled < end]
    lags = [c.sent - c.scheduled for c in in_window]
    return {
        "timers": STEADY_TIMERS,
        "every_s": WINDOWED_EVERY_S,
        "window_seconds": WINDOWED_S,
        "measured_s": window_s,
        **summary(in_window, duplicates, STEADY_TIMERS * window_s // WINDOWED_EVERY_S),
        "outside_window": sum(not 0 <= lag <= WINDOWED_S * 1000 for lag in lags),
        "sends_per_run": round(len(callbacks) / max(1, runs["runs"]), 1),
    }


def spaced(a: Tenant, count: int) -> dict[str, Any]:
    rng = random.Random(11)
    base = (now_ms() // 1000 + 3) * 1000
    ids = [a.call("POST", "/timers", at(base + i * 1500 + rng.randrange(1000)))["id"]
           for i in range(count)]  # fmt: skip
    wait_for(lambda: len(a.consumer.of(set(ids))[0]) == count, count * 1.5 + 15)
    return {"one_shots": count, **summary(*a.consumer.of(set(ids)), count)}


def fairness(a: Tenant, b: Tenant, burst: int) -> dict[str, Any]:
    due = (now_ms() // 1000 + 6) * 1000
    started = time.monotonic()
    a_ids = a.create_batch([at(due) for _ in range(burst)])
    b_ids = [b.call("POST", "/timers", at(due))["id"]]
    batch_s = (time.monotonic() - started) / (burst / BATCH)
    time.sleep(max(0.0, (due - 1000 - now_ms()) / 1000))
    cpu0, runs0 = cpu_seconds(a.stack), trigger_runs(a.stack)
    wait_for(lambda: len(a.consumer.of(set(a_ids))[0]) == burst, 120)
    cpu1, runs1 = cpu_seconds(a.stack), trigger_runs(a.stack)
    wait_for(lambda: len(b.consumer.of(set(b_ids))[0]) == 1, 10)
    a_stats, b_stats = (
        summary(*a.consumer.of(set(a_ids)), burst),
        summary(*b.consumer.of(set(b_ids)), 1),
    )
    b_lag = b_stats["fired_at_lag_ms"]["max"]
    moto, total = cpu1["moto"] - cpu0["moto"], cpu1["stack"] - cpu0["stack"]
    return {"a_burst": burst, "a": a_stats, "b": b_stats, "b_lag_ms": b_lag,
            "seconds_per_batch_create": round(batch_s, 3),
            "cpu_s": {"moto": round(moto, 2), "stack": round(total, 2)},
            "trigger": runs_between(runs0, runs1)}  # fmt: skip


def burst(a: Tenant, n: int, seconds_per_batch: float) -> dict[str, Any]:
    setup_s = n / BATCH * seconds_per_batch * 1.5 + 5  # batches/s as measured with 300
    due = (now_ms() // 1000 + 1 + int(setup_s)) * 1000
    ids = set(a.create_batch([at(due) for _ in range(n)]))
    ready_late_ms = max(0, now_ms() - due)  # the setup outran its plan: lags include it
    time.sleep(max(0.0, (due - now_ms()) / 1000))
    cpu0, runs0 = cpu_seconds(a.stack), trigger_runs(a.stack)
    drained = wait_for(lambda: len(a.consumer.of(ids)[0]) == n, DRAIN_WAIT_S)
    cpu1, runs1 = cpu_seconds(a.stack), trigger_runs(a.stack)
    time.sleep(2)
    callbacks, duplicates = a.consumer.of(ids)
    last = max((c.fired for c in callbacks), default=due)
    moto, total = cpu1["moto"] - cpu0["moto"], cpu1["stack"] - cpu0["stack"]
    rate = len(callbacks) / max(0.001, (last - due) / 1000)
    outcome = summary(callbacks, duplicates, n)
    if not drained:  # what has not arrived yet is on its way, not missing
        outcome |= {
            "missing": None,
            "arrived": len(callbacks),
            "projected_drain_s": round(n / rate),
        }
    return {
        "n": n,
        "drained": drained,
        "drain_s": round((last - due) / 1000, 2),
        "fires_per_s": round(rate, 1),
        **outcome,
        "setup_ended_late_ms": ready_late_ms,
        "moto_share_of_stack_cpu": round(moto / total, 2) if total else None,
        "moto_busy": round(moto / max(0.001, (last - due) / 1000), 2),
        "trigger": runs_between(runs0, runs1),
    }


def neighbour_of(tenant: str, buckets: int = 16) -> str:
    """A tenant name that sorts after ``tenant`` and whose home partition lands in the same
    bucket, so its timers share every bucket with ``tenant``'s (spread 8 of 16)."""
    home = zlib.crc32(tenant.encode()) % PARTITIONS % buckets
    return next(name for n in range(10_000) if (name := f"{tenant}-z{n}") > tenant
                and zlib.crc32(name.encode()) % PARTITIONS % buckets == home)  # fmt: skip


def hot_and_lone(
    hot: Tenant, lone_tenant: Tenant, burst: int, lone: int, ahead_s: int
) -> dict[str, Any]:
    """Tenant H's ``burst`` one-shots due in one millisecond (batch creates, ``ahead_s``
    ahead), tenant L's ``lone`` in the same millisecond: L's lag while H's burst drains, H's
    drain, and what the stack said meanwhile (runs killed at their timeout, events dropped)."""
    due = (now_ms() // 1000 + ahead_s) * 1000
    started = time.monotonic()
    h_ids = set(hot.create_batch([at(due) for _ in range(burst)]))
    l_ids = set(lone_tenant.create_batch([at(due) for _ in range(lone)]))
    created_s = round(time.monotonic() - started, 1)
    late_setup_ms = max(0, now_ms() - due)
    lines0 = len(hot.stack.lines)
    time.sleep(max(0.0, (due - 1000 - now_ms()) / 1000))
    cpu0, runs0 = cpu_seconds(hot.stack), trigger_runs(hot.stack)
    wait_for(lambda: len(lone_tenant.consumer.of(l_ids)[0]) == lone, 60)
    drained = wait_for(lambda: len(hot.consumer.of(h_ids)[0]) == burst, DRAIN_WAIT_S)
    cpu1, runs1 = cpu_seconds(hot.stack), trigger_runs(hot.stack)
    time.sleep(3)
    h_calls, h_dups = hot.consumer.of(h_ids)
    said = hot.stack.lines[lines0:]
    return {
        "burst": burst,
        "lone": lone,
        "created_in_s": created_s,
        "setup_ended_late_ms": late_setup_ms,
        "l": summary(*lone_tenant.consumer.of(l_ids), lone),
        "h": summary(h_calls, h_dups, burst),
        "h_drained": drained,
        "h_last_sent_s": round((max((c.sent for c in h_calls), default=due) - due) / 1000, 2),
        "runs_timed_out": sum("Task timed out" in line for line in said),
        "events_dropped": sum("dropped an event" in line for line in said),
        "cpu_s": {k: round(cpu1[k] - cpu0[k], 1) for k in cpu0},
        "trigger": runs_between(runs0, runs1),
    }


def hot_second_default(burst: int = 6_000, lone: int = 8) -> dict[str, Any]:
    """The hot second on ``make run`` as it starts by default (its sandboxes, its buckets)."""
    with local_stack("hot_6000") as stack:
        h_made = admin(stack, "tenant", "create", "bench-h")
        l_made = admin(stack, "tenant", "create", neighbour_of("bench-h"))
        h = Tenant(stack, h_made["api_key"], h_made["callback_queue_url"])
        lo = Tenant(stack, l_made["api_key"], l_made["callback_queue_url"])
        progress(f"e2e: tenant H's {burst:,} in one ms, tenant L's {lone} beside them")
        result = hot_and_lone(h, lo, burst, lone, HOT_AHEAD_S)
        h.consumer.stop()
        lo.consumer.stop()
    return result


@contextmanager
def local_stack(label: str, **env: str) -> Iterator[RunningStack]:
    """A fresh stack (its own tables, queues and Redis); its logs are kept in LOGS/<label>."""
    with tempfile.TemporaryDirectory(prefix="bench-e2e-") as state_dir:
        stack = start_stack(Path(state_dir), **env)
        try:
            stack.wait_ready()
            yield stack
        finally:
            stack.stop()
            shutil.rmtree(LOGS / label, ignore_errors=True)
            shutil.copytree(Path(state_dir, "logs"), LOGS / label)


def demo_tenant(stack: RunningStack) -> Tenant:
    return Tenant(stack, stack.ready["Tenant demo API key: "],
                  stack.ready["Tenant demo callback queue: "])  # fmt: skip


def on_time(window_s: int, short: bool) -> dict[str, Any]:
    """Steady load, spaced one-shots and the fairness check, on one stack."""
    out: dict[str, Any] = {}
    with local_stack("steady") as stack:
        a = demo_tenant(stack)
        tenant_b = admin(stack, "tenant", "create", "bench-b")
        b = Tenant(stack, tenant_b["api_key"], tenant_b["callback_queue_url"])
        progress(f"e2e: fresh stack, {STEADY_TIMERS} timers every 1 s, {window_s} s window")
        out["fresh"] = fresh(a, window_s)
        progress(f"e2e: fresh sent lag {out['fresh']['sent_lag_ms']}")
        progress(f"e2e: steady, {STEADY_TIMERS} timers every 1 s, {window_s} s window")
        out["steady"] = steady(a, window_s)
        progress(f"e2e: steady fired_at lag {out['steady']['fired_at_lag_ms']}")
        progress(f"e2e: windowed, {STEADY_TIMERS} timers every {WINDOWED_EVERY_S} s, "
                 f"window {WINDOWED_S} s")  # fmt: skip
        out["windowed"] = windowed(a, window_s)
        progress(f"e2e: windowed sent lag from due {out['windowed']['sent_lag_ms']}")
        progress("e2e: spaced one-shots")
        out["spaced"] = spaced(a, 10 if short else 20)
        progress("e2e: tenant B's lone timer during tenant A's 300-burst")
        out["fairness"] = fairness(a, b, 300)
        a.consumer.stop()
        b.consumer.stop()
    return out


def hot_second() -> dict[str, Any]:
    """The fairness check alone, after a short steady load warms the sandboxes (as in
    on_time, where it follows the steady and spaced scenarios)."""
    with local_stack("hot_second") as stack:
        a = demo_tenant(stack)
        tenant_b = admin(stack, "tenant", "create", "bench-b")
        b = Tenant(stack, tenant_b["api_key"], tenant_b["callback_queue_url"])
        progress(f"e2e: warm-up, {STEADY_TIMERS} timers every 1 s")
        steady(a, 5)
        progress("e2e: tenant B's lone timer during tenant A's 300-burst")
        result = fairness(a, b, 300)
        a.consumer.stop()
        b.consumer.stop()
    return result


def main() -> int:
    short = quick()
    window_s, bursts = (30, [1_000]) if short else (60, [1_000, 10_000])
    if sys.argv[1:] == ["fresh"]:  # python -m bench.e2e fresh: fresh, then warmed (printed)
        with local_stack("fresh") as stack:
            a = demo_tenant(stack)
            result = {"fresh": fresh(a, window_s), "warm": steady(a, window_s)}
            a.consumer.stop()
        print(json.dumps(result, indent=1))
        return 0
    if sys.argv[1:] == ["windowed"]:  # python -m bench.e2e windowed: printed
        with local_stack("windowed") as stack:
            a = demo_tenant(stack)
            result = windowed(a, window_s)
            a.consumer.stop()
        print(json.dumps(result, indent=1))
        return 0
    if sys.argv[1:] == ["hot"]:  # python -m bench.e2e hot: 6,000 + 8 on the default stack
        print(json.dumps(hot_second_default(), indent=1))
        return 0
    if sys.argv[1:] == ["fairness"]:  # python -m bench.e2e fairness: the 300-burst alone
        print(json.dumps(hot_second(), indent=1))  # printed, not written to the results
        return 0
    only_bursts = sys.argv[1:] == ["bursts"]  # python -m bench.e2e bursts: the bursts alone
    last = last_results("e2e")
    out: dict[str, Any] = {"quick": short, **({"cold": last["cold"]} if "cold" in last else {})}
    if only_bursts:  # keep the other scenarios' last results
        out = {**last, "quick": short}
    if not only_bursts:
        out |= on_time(window_s, short)
    for n in bursts:  # each on a fresh stack: no deep queue inherited
        with local_stack(f"burst_{n}", LOCAL_LAMBDA_CONCURRENCY=BURST_SANDBOXES) as stack:
            progress(f"e2e: a burst of {n:,} one-shots due in one second")
            a = demo_tenant(stack)
            out[f"burst_{n}"] = burst(a, n, out["fairness"]["seconds_per_batch_create"])
            a.consumer.stop()
            progress(f"e2e: {out[f'burst_{n}']}")
    out["burst_sandboxes"] = int(BURST_SANDBOXES)
    out["rerun"] = "make bench" + (" QUICK=1" if short else "") + "  (or python -m bench.e2e)"
    path = write_results("e2e", out)
    print(json.dumps({k: v for k, v in out.items() if k != "rerun"}, indent=1))
    print(f"written to {path}; rerun: {out['rerun']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

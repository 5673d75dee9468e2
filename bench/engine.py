"""Engine benchmark: the Redis claim -> acknowledge path against the naive design it replaces.

``python -m bench.engine`` (``QUICK=1`` for the short run) starts its own redis-server and
measures, on the same server and the same in-process sink:

- **engine** — the project's own ``RedisIndex``: N timers, all due at one injected "now", spread
  over the deployed 64 buckets by crc32 of the timer id; W worker processes each loop over the
  buckets (each from its own starting bucket, so they meet and share buckets late in the drain,
  as concurrent triggers on one bucket do): ``lease`` up to BATCH_LIMIT (250) members (one Lua
  script), hand each member to the sink, ``ack`` them (one Lua script).
- **baseline** — the design the seeds reject (Tencent Qidian's "industry approach": one zset
  polled under one distributed lock): one sorted set, a global lock taken with ``SET NX PX``;
  the holder runs ``ZRANGEBYSCORE key -inf now LIMIT 0 k``, ``ZREM``s each member one by one
  (the member is the holder's to send only if its ZREM removed it), sends it, then ``DEL``s the
  lock. The same W workers compete for the lock; a loser retries after a short sleep.

Workers are processes, not threads: the real system runs one trigger per bucket slice, each its
own Lambda with its own CPU, and CPython threads would serialise the client work on the GIL.
Every fire is counted per timer afterwards: each design must fire each member exactly once.
Nothing sleeps for wall-clock time except the baseline's lock retry; the due time is injected.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import queue
import time
import uuid
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, cast

import redis

from bench.common import progress, quick, write_results
from ops.redis_server import RedisServer
from timers.config import Settings
from timers.firing import BATCH_LIMIT, LEASE_MS
from timers.redis_index import ACK_LUA, LEASE_LUA, RedisIndex

NOW_MS = 1_795_255_200_000  # the injected "now" (2026-11-21T10:00:00Z); every timer is due by it
TENANT = "bench"
LOAD_CHUNK = 50_000  # timers per RedisIndex.add call while loading (progress granularity)
SINGLE_WORKER_TIMERS = 200_000  # enough for a steady rate from one process, in a few seconds
NAIVE_KEY = "naive:due"
NAIVE_LOCK = "naive:lock"
NAIVE_LOCK_TTL_MS = 5_000  # far above one batch's time: the lock never lapses under its holder
NAIVE_RETRY_S = 0.001  # a loser's pause before trying the lock again (generous to the baseline)
ZADD_CHUNK = 10_000  # members per ZADD while loading the baseline's zset


def timer_id(i: int) -> str:
    return f"t{i:08d}"


def index_of(member: str) -> int:
    """The timer number in a member ``bench|t00000042|<due>`` (both designs use these)."""
    return int(member.split("|", 2)[1][1:])


def due_ms(i: int) -> int:
    """Due times spread over the second before now, so the scores are not all equal."""
    return NOW_MS - (i % 1_000)


@dataclass(frozen=True)
class WorkerResult:
    worker: int
    started: float  # time.monotonic(): CLOCK_MONOTONIC, comparable across processes on Linux
    finished: float
    fired: int
    calls: int  # lease+ack script calls (engine) or lock attempts (baseline)
    round_trips: int
    fired_ids: bytes  # array('I') of the timer numbers this worker sent to its sink


# ---------------------------------------------------------------- workers (child processes)


def _engine_worker(
    url: str, buckets: int, worker: int, workers: int, batch: int, ready: Any, out: Any
) -> None:
    client = redis.Redis.from_url(url, decode_responses=True)
    index = RedisIndex(client, buckets)
    client.ping()
    sink: list[str] = []  # the in-process "SQS": every member sent lands here
    calls = 0
    # Each worker starts at its own bucket and then visits every bucket, so late in the drain
    # several workers lease from one bucket at once (the script hands them disjoint members).
    first = worker * buckets // workers
    order = [(first + k) % buckets for k in range(buckets)]
    ready.wait()
    started = time.monotonic()
    for bucket in order:
        while True:
            owner = uuid.uuid4().hex  # a fresh owner per round, as the trigger does
            leased = index.lease(bucket, NOW_MS, LEASE_MS, batch, owner)
            calls += 1
            if not leased.members:
                break
            for m in leased.members:
                sink.append(m)
            index.ack(bucket, owner, leased.members)
            calls += 1
    finished = time.monotonic()
    ids = array("I", (index_of(m) for m in sink))
    out.put(WorkerResult(worker, started, finished, len(sink), calls, calls, ids.tobytes()))


def _naive_worker(url: str, worker: int, batch: int, retry_s: float, ready: Any, out: Any) -> None:
    client = redis.Redis.from_url(url, decode_responses=True)
    client.ping()
    sink: list[str] = []
    attempts = round_trips = 0
    ready.wait()
    started = time.monotonic()
    while True:
        attempts += 1
        round_trips += 1
        if not client.set(NAIVE_LOCK, str(worker), nx=True, px=NAIVE_LOCK_TTL_MS):
            time.sleep(retry_s)
            continue
        try:
            due = cast(
                list[str], client.zrangebyscore(NAIVE_KEY, "-inf", NOW_MS, start=0, num=batch)
            )
            round_trips += 1
            for m in due:
                round_trips += 1
                if client.zrem(NAIVE_KEY, m):  # one round trip per member: the naive part
                    sink.append(m)
        finally:
            client.delete(NAIVE_LOCK)
            round_trips += 1
        if not due:
            break
    finished = time.monotonic()
    ids = array("I", (index_of(m) for m in sink))
    out.put(
        WorkerResult(worker, started, finished, len(sink), attempts, round_trips, ids.tobytes())
    )


# ---------------------------------------------------------------- driver


@dataclass(frozen=True)
class Drain:
    timers: int
    seconds: float
    fires_per_s: float
    fired: int
    exactly_once: int
    missed: int
    duplicated: int
    calls: int
    round_trips: int
    left_in_redis: int
    redis_cpu_s: float  # redis-server user+sys CPU during the drain (INFO cpu)

    @property
    def correct(self) -> bool:
        return self.exactly_once == self.timers and self.fired == self.timers

    def as_dict(self) -> dict[str, Any]:
        return {
            "timers": self.timers,
            "seconds": round(self.seconds, 3),
            "fires_per_s": round(self.fires_per_s),
            "fired": self.fired,
            "exactly_once": self.exactly_once,
            "missed": self.missed,
            "duplicated": self.duplicated,
            "correct": self.correct,
            "round_trips": self.round_trips,
            "round_trips_per_fire": round(self.round_trips / max(1, self.fired), 4),
            "left_in_redis": self.left_in_redis,
            "redis_cpu_s": round(self.redis_cpu_s, 3),
            "redis_cpu_us_per_fire": round(self.redis_cpu_s * 1e6 / max(1, self.fired), 2),
            "redis_cpu_busy": round(self.redis_cpu_s / self.seconds, 3) if self.seconds else None,
        }


def _run_workers(
    label: str,
    n: int,
    targets: list[tuple[Callable[..., None], tuple[Any, ...]]],
    remaining: Callable[[], int],
) -> list[WorkerResult]:
    """Start the workers, release them together, report progress, collect their results."""
    ctx = mp.get_context("spawn")  # fresh interpreters, like separate Lambdas
    ready = ctx.Barrier(len(targets) + 1)
    out = ctx.Queue()
    procs = [ctx.Process(target=fn, args=(*args, ready, out)) for fn, args in targets]
    for p in procs:
        p.start()
    ready.wait(timeout=120)
    t0 = time.monotonic()
    results: list[WorkerResult] = []
    last = t0
    while len(results) < len(procs):
        try:
            results.append(out.get(timeout=0.5))
            continue
        except queue.Empty:
            pass
        if time.monotonic() - last >= 3:
            last = time.monotonic()
            done = n - remaining()
            progress(f"{label}: {done:,}/{n:,} fired ({done / (last - t0):,.0f}/s so far)")
        if not any(p.is_alive() for p in procs) and out.empty():
            raise RuntimeError(f"{label}: a worker died (exit codes {[p.exitcode for p in procs]})")
    for p in procs:
        p.join(timeout=30)
    return results


def _tally(n: int, results: list[WorkerResult]) -> tuple[int, int, int]:
    """(exactly once, missed, duplicated) over timer numbers 0..n-1."""
    counts = bytearray(n)
    for r in results:
        for i in array("I", r.fired_ids):
            counts[i] = min(255, counts[i] + 1)
    once = counts.count(1)
    missed = counts.count(0)
    return once, missed, n - once - missed


def _redis_cpu_s(client: Any) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def _summarise(n: int, results: list[WorkerResult], left: int, cpu_s: float) -> Drain:
    seconds = max(r.finished for r in results) - min(r.started for r in results)
    fired = sum(r.fired for r in results)
    once, missed, dup = _tally(n, results)
    return Drain(
        timers=n,
        seconds=seconds,
        fires_per_s=fired / seconds if seconds > 0 else 0.0,
        fired=fired,
        exactly_once=once,
        missed=missed,
        duplicated=dup,
        calls=sum(r.calls for r in results),
        round_trips=sum(r.round_trips for r in results),
        left_in_redis=left,
        redis_cpu_s=cpu_s,
    )


def _chunks(n: int, size: int) -> Iterator[range]:
    for start in range(0, n, size):
        yield range(start, min(n, start + size))


def run_engine(url: str, n: int, workers: int, buckets: int, batch: int) -> Drain:
    client = redis.Redis.from_url(url, decode_responses=True)
    client.flushall()
    index = RedisIndex(client, buckets)
    t0 = time.monotonic()
    for part in _chunks(n, LOAD_CHUNK):
        index.add((TENANT, timer_id(i), due_ms(i)) for i in part)
        if part.stop % (LOAD_CHUNK * 4) == 0 or part.stop == n:
            progress(f"engine: loaded {part.stop:,}/{n:,} timers into {buckets} buckets")
    loaded = sum(index.size(b)[0] for b in range(buckets))
    if loaded != n:
        raise RuntimeError(f"engine: {loaded} members loaded, expected {n}")
    progress(f"engine: load took {time.monotonic() - t0:.1f}s; draining with {workers} workers")
    client.script_load(LEASE_LUA)  # the workers' EVALSHA finds the scripts already loaded
    client.script_load(ACK_LUA)

    def remaining() -> int:
        pipe = client.pipeline(transaction=False)
        for b in range(buckets):
            k = index.keys(b)
            pipe.zcard(k.due)
            pipe.zcard(k.lease)
        return int(sum(pipe.execute()))

    targets: list[tuple[Callable[..., None], tuple[Any, ...]]] = [
        (_engine_worker, (url, buckets, w, workers, batch)) for w in range(workers)
    ]
    cpu0 = _redis_cpu_s(client)
    results = _run_workers("engine", n, targets, remaining)
    drain = _summarise(n, results, remaining(), _redis_cpu_s(client) - cpu0)
    client.close()
    return drain


def run_baseline(url: str, n: int, workers: int, batch: int, retry_s: float) -> Drain:
    client = redis.Redis.from_url(url, decode_responses=True)
    client.flushall()
    t0 = time.monotonic()
    for part in _chunks(n, ZADD_CHUNK):
        client.zadd(NAIVE_KEY, {f"{TENANT}|{timer_id(i)}|{due_ms(i)}": due_ms(i) for i in part})
        if part.stop % 200_000 == 0 or part.stop == n:
            progress(f"baseline: loaded {part.stop:,}/{n:,} timers into one zset")
    progress(f"baseline: load took {time.monotonic() - t0:.1f}s; draining with {workers} workers")

    def remaining() -> int:
        return int(client.zcard(NAIVE_KEY))

    targets: list[tuple[Callable[..., None], tuple[Any, ...]]] = [
        (_naive_worker, (url, w, batch, retry_s)) for w in range(workers)
    ]
    cpu0 = _redis_cpu_s(client)
    results = _run_workers("baseline", n, targets, remaining)
    drain = _summarise(n, results, remaining(), _redis_cpu_s(client) - cpu0)
    client.close()
    return drain


def main(argv: list[str] | None = None) -> int:
    short = quick()
    parser = argparse.ArgumentParser(prog="python -m bench.engine", description=__doc__)
    parser.add_argument("--timers", type=int, default=100_000 if short else 1_000_000)
    parser.add_argument(
        "--baseline-timers",
        type=int,
        default=None,
        help="timers for the naive baseline (default: the same as --timers)",
    )
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=BATCH_LIMIT)
    parser.add_argument("--buckets", type=int, default=Settings().bucket_count)
    parser.add_argument("--naive-retry-ms", type=float, default=NAIVE_RETRY_S * 1000)
    args = parser.parse_args(argv)
    n, workers, batch, buckets = args.timers, args.workers, args.batch, args.buckets
    base_n = args.baseline_timers or n

    progress(f"engine benchmark ({'quick' if short else 'full'}): {n:,} timers, {workers} workers")
    load_before = os.getloadavg()[0]
    server = RedisServer.start(new_session=True)  # our own server; Ctrl-C reaches us, not it
    try:
        engine = run_engine(server.url, n, workers, buckets, batch)
        progress(
            f"engine: {engine.fires_per_s:,.0f} fires/s ({engine.fired:,} in {engine.seconds:.2f}s)"
            f", exactly once: {engine.exactly_once:,}/{n:,}"
        )
        # What one trigger process sustains on its own (an input of the capacity model).
        single_n = min(n, SINGLE_WORKER_TIMERS)
        single = run_engine(server.url, single_n, 1, buckets, batch)
        progress(f"engine, one worker: {single.fires_per_s:,.0f} fires/s over {single_n:,} timers")
        baseline = run_baseline(server.url, base_n, workers, batch, args.naive_retry_ms / 1000)
        progress(
            f"baseline: {baseline.fires_per_s:,.0f} fires/s ({baseline.fired:,} in "
            f"{baseline.seconds:.2f}s), exactly once: {baseline.exactly_once:,}/{base_n:,}"
        )
        # The baseline without lock contention: its best case, so the ratio can be judged.
        base_single_n = min(base_n, SINGLE_WORKER_TIMERS)
        base_single = run_baseline(server.url, base_single_n, 1, batch, args.naive_retry_ms / 1000)
        progress(
            f"baseline, one worker: {base_single.fires_per_s:,.0f} fires/s over "
            f"{base_single_n:,} timers"
        )
    finally:
        server.stop()

    ratio = engine.fires_per_s / baseline.fires_per_s if baseline.fires_per_s else None
    section: dict[str, Any] = {
        "fires_per_s": round(engine.fires_per_s),
        "baseline_fires_per_s": round(baseline.fires_per_s),
        "ratio": round(ratio, 2) if ratio else None,
        "timers": n,
        "baseline_timers": base_n,
        "baseline_note": (
            "same N as the engine"
            if base_n == n
            else f"baseline measured on {base_n:,} timers, not {n:,}: fires/s is a rate"
        ),
        "workers": workers,
        "worker_kind": "processes (multiprocessing spawn), one redis connection each",
        "buckets": buckets,
        "batch": batch,
        "correct": all(d.correct for d in (engine, baseline, single, base_single)),
        "single_worker_fires_per_s": round(single.fires_per_s),
        "baseline_single_worker_fires_per_s": round(base_single.fires_per_s),
        "ratio_single_worker": round(single.fires_per_s / base_single.fires_per_s, 2),
        "engine": engine.as_dict(),
        "single_worker": single.as_dict(),
        "baseline": {
            **baseline.as_dict(),
            "design": "one zset, one SET NX PX lock; ZRANGEBYSCORE -inf now LIMIT 0 batch, "
            "ZREM per member, DEL lock",
            "lock_retry_ms": args.naive_retry_ms,
            "lock_attempts": baseline.calls,
        },
        "baseline_single_worker": base_single.as_dict(),
        "sink": "in-process list (stands in for SQS)",
        "load_average_1m": {"before": load_before, "after": os.getloadavg()[0]},
        "quick": short,
        "rerun": "make bench" + (" QUICK=1" if short else "") + "  (or python -m bench.engine)",
    }
    path = write_results("engine", section)
    print(
        f"engine: {engine.fires_per_s:,.0f} fires/s over {n:,} timers; naive baseline "
        f"{baseline.fires_per_s:,.0f} fires/s over {base_n:,}; ratio {section['ratio']}x; "
        f"exactly once: engine {engine.correct}, baseline {baseline.correct}\n"
        f"written to {path}; rerun: {section['rerun']}"
    )
    return 0 if section["correct"] else 1


if __name__ == "__main__":
    raise SystemExit(main())

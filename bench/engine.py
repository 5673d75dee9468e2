"""Engine benchmark: the Redis lease -> finish path against the naive design it replaces.

``python -m bench.engine`` (``QUICK=1``: the short run) starts its own redis-server and drains
N one-shot members, all due at one injected "now", with W worker processes (each its own
interpreter and connection, as each trigger is its own Lambda):

- **engine** - the project's ``BucketIndex``: cards put into the deployed buckets by
  partition; each worker visits every bucket from its own starting point (so late in the drain
  several lease from one bucket, as concurrent runs of a bucket do): ``lease`` up to
  LEASE_LIMIT cards (one Lua script), sink them, ``settle`` them (one Lua script).
- **baseline** - the design the seeds reject: one sorted set under one ``SET NX PX`` lock; the
  holder reads ``ZRANGEBYSCORE ... LIMIT``, ``ZREM``s each member (its to send only if the ZREM
  removed it), and deletes the lock; losers retry after 1 ms.

Every fire is tallied per timer afterwards: each design must fire each member exactly once.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import redis

from bench.common import last_results, progress, quick, write_results
from ops.redis_server import RedisServer
from timers.config import Settings
from timers.core.schedule import EverySchedule
from timers.core.timer import Timer
from timers.engine.entries import PARTITIONS
from timers.engine.index import BucketIndex, Card
from timers.engine.trigger import LEASE_LIMIT

NOW_MS = 1_795_255_200_000  # 2026-11-21T10:00:00Z; every member is due by then
LOAD_CHUNK = 20_000
NAIVE_KEY, NAIVE_LOCK = "naive:due", "naive:lock"


SHAPES = {
    "one_shot": "50 tenants; each fire ends its timer's chain",
    "recurring": "50 tenants; each fire chains its timer's next position (a minute on)",
    "one_tenant": "one tenant (a hot second): no round-robin across tenants",
}
"""Per-fire Redis work (1 worker, commands counted inside the scripts too) for each shape."""


def member(i: int, tenants: int = 50) -> Card:
    """Timer i, due in the second before now (scores differ), in tenant i % tenants: a card
    with a small payload, as most are."""
    due = NOW_MS - i % 1000
    timer = Timer(f"t{i % tenants}", f"x{i}", EverySchedule(60), NOW_MS - 60_000, "queue", "1",
                  rev=1, partition=i % PARTITIONS)  # fmt: skip
    return Card(timer, due, 0, None, due)


def chained(card: Card) -> Card:
    return card.at(card.pos + 60_000, card.n + 1, card.pos)


RTT_MS = 0.3
"""A network round trip to ElastiCache from a Lambda in the same AZ (~0.2-0.5 ms; loopback
here is ~0.03 ms): the ``_rtt`` runs add it to every request of both designs."""


def connect(url: str, rtt_ms: float, **kw: Any) -> redis.Redis:
    """A client whose every request (a command, or a pipeline) waits ``rtt_ms`` on the wire."""

    class Distant(redis.Connection):
        def send_packed_command(self, command: Any, check_health: bool = True) -> None:
            super().send_packed_command(command, check_health)
            time.sleep(rtt_ms / 1000)

    return redis.Redis.from_url(url, **kw, **({"connection_class": Distant} if rtt_ms else {}))


def engine_worker(
    url: str, buckets: int, first: int, ready: Any, out: Any, chain: bool, rtt_ms: float
) -> None:
    index = BucketIndex(connect(url, rtt_ms), buckets)
    fired: list[str] = []
    calls = 0
    ready.wait()
    started = time.monotonic()
    for bucket in [(first + k) % buckets for k in range(buckets)]:
        while True:
            leased = index.lease(bucket, NOW_MS, NOW_MS + 60_000, LEASE_LIMIT)
            calls += 1
            if not leased.cards:
                break
            fired += [c.timer.id for c in leased.cards]  # the sink: stands in for SQS
            index.settle(bucket, [(c, chained(c) if chain else None, c.timer.rev)
                                  for c in leased.cards])  # fmt: skip
            calls += 1
    out.put((started, time.monotonic(), fired, calls))


def naive_worker(url: str, _buckets: int, worker: int, ready: Any, out: Any, rtt_ms: float) -> None:
    client = connect(url, rtt_ms, decode_responses=True)
    fired: list[str] = []
    calls = 0
    ready.wait()
    started = time.monotonic()
    while True:
        calls += 1
        if not client.set(NAIVE_LOCK, worker, nx=True, px=5_000):
            time.sleep(0.001)
            continue
        due: list[str] = client.zrangebyscore(NAIVE_KEY, "-inf", NOW_MS, start=0, num=LEASE_LIMIT)  # type: ignore[assignment]
        for text in due:
            calls += 1
            if client.zrem(NAIVE_KEY, text):  # a round trip per member: the naive part
                fired.append(text.split("|")[1])
        client.delete(NAIVE_LOCK)
        calls += 2
        if not due:
            break
    out.put((started, time.monotonic(), fired, calls))


def load(url: str, design: str, n: int, buckets: int, tenants: int = 50) -> None:
    client = redis.Redis.from_url(url)
    client.flushall()
    index = BucketIndex(client, buckets)
    for start in range(0, n, LOAD_CHUNK):
        chunk = [member(i, tenants) for i in range(start, min(n, start + LOAD_CHUNK))]
        if design == "engine":
            index.put(chunk)
        else:
            client.zadd(NAIVE_KEY, {f"{c.timer.tenant}|{c.timer.id}|{c.pos}": c.pos for c in chunk})
    progress(f"{design}: {n:,} members loaded")


def redis_cpu_s(client: redis.Redis) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def redis_commands(client: redis.Redis) -> int:
    """Commands run since the last CONFIG RESETSTAT, those inside scripts included."""
    stats = client.info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items() if k != "cmdstat_info")


def drain(
    url: str, design: str, n: int, workers: int, buckets: int, shape: str = "one_shot",
    rtt_ms: float = 0.0,
) -> dict[str, Any]:  # fmt: skip
    load(url, design, n, buckets, tenants=1 if shape == "one_tenant" else 50)
    worker: Callable[..., None] = engine_worker if design == "engine" else naive_worker
    ctx = mp.get_context("spawn")
    ready, out = ctx.Barrier(workers + 1), ctx.Queue()
    extra = (shape == "recurring", rtt_ms) if design == "engine" else (rtt_ms,)
    procs = [ctx.Process(target=worker,
                         args=(url, buckets, w * buckets // workers, ready, out, *extra))
             for w in range(workers)]  # fmt: skip
    for p in procs:
        p.start()
    client = redis.Redis.from_url(url)
    client.config_resetstat()
    cpu0 = redis_cpu_s(client)
    ready.wait(timeout=120)
    results = [out.get(timeout=1_800) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    seconds = max(r[1] for r in results) - min(r[0] for r in results)
    counts = Counter(t for r in results for t in r[2])
    fired, calls = sum(counts.values()), sum(r[3] for r in results)
    once = sum(1 for c in counts.values() if c == 1)
    return {
        "timers": n,
        "workers": workers,
        "seconds": round(seconds, 3),
        "fires_per_s": round(fired / seconds),
        "exactly_once": once,
        "missed": n - len(counts),
        "duplicated": fired - len(counts),
        "correct": once == n == fired,
        "redis_calls_per_fire": round(calls / max(1, fired), 4),
        "redis_cpu_us_per_fire": round((redis_cpu_s(client) - cpu0) * 1e6 / max(1, fired), 2),
        "redis_commands_per_fire": round(redis_commands(client) / max(1, fired), 3),
    }


def main() -> int:
    short = quick()
    n = 100_000 if short else 1_000_000
    buckets = Settings().bucket_count
    progress(f"engine benchmark: {n:,} members, engine vs naive, 4 workers and 1")
    server = RedisServer.start(new_session=True)
    runs: dict[str, dict[str, Any]] = {}
    try:
        for design in ("engine", "baseline"):
            for workers in (4, 1):
                size = n if workers > 1 else min(n, 200_000)
                run = runs[f"{design}_{workers}w"] = drain(
                    server.url, design, size, workers, buckets
                )
                progress(f"{design}, {workers} worker(s): {run['fires_per_s']:,} fires/s, "
                         f"exactly once {run['exactly_once']:,}/{size:,}")  # fmt: skip
            size = min(n, 100_000)  # the naive design drains ~3,000/s at this round trip
            run = runs[f"{design}_4w_rtt"] = drain(
                server.url, design, size, 4, buckets, rtt_ms=RTT_MS
            )
            progress(f"{design}, 4 workers, {RTT_MS} ms round trips: {run['fires_per_s']:,} "
                     f"fires/s, exactly once {run['exactly_once']:,}/{size:,}")  # fmt: skip
        per_fire: dict[str, dict[str, Any]] = {}
        for shape, description in SHAPES.items():
            run = drain(server.url, "engine", min(n, 200_000), 1, buckets, shape)
            per_fire[shape] = {"description": description, **{
                k: run[k] for k in ("redis_commands_per_fire", "redis_cpu_us_per_fire",
                                    "fires_per_s", "correct")}}  # fmt: skip
            progress(f"engine per fire, {shape}: {run['redis_commands_per_fire']} Redis "
                     f"commands, {run['redis_cpu_us_per_fire']} us of Redis CPU")  # fmt: skip
    finally:
        server.stop()
    engine, baseline = runs["engine_4w"], runs["baseline_4w"]
    far, far_naive = runs["engine_4w_rtt"], runs["baseline_4w_rtt"]
    section = {
        "fires_per_s": engine["fires_per_s"],
        "baseline_fires_per_s": baseline["fires_per_s"],
        "ratio": round(engine["fires_per_s"] / baseline["fires_per_s"], 2),
        "rtt_ms": RTT_MS,
        "ratio_at_rtt": round(far["fires_per_s"] / far_naive["fires_per_s"], 2),
        "lease_limit": LEASE_LIMIT,
        "buckets": buckets,
        "correct": all(r["correct"] for r in [*runs.values(), *per_fire.values()]),
        "runs": runs,
        "per_fire": per_fire,
        "load_average_1m": os.getloadavg()[0],
        "quick": short,
        "rerun": "make bench" + (" QUICK=1" if short else "") + "  (or python -m bench.engine)",
    }
    if "hot_second" in (last := last_results("engine")):  # bench.hot_second's, kept
        section["hot_second"] = last["hot_second"]
    path = write_results("engine", section)
    print(f"engine: {engine['fires_per_s']:,} fires/s, naive {baseline['fires_per_s']:,} fires/s "
          f"({section['ratio']}x on loopback, {section['ratio_at_rtt']}x at {RTT_MS} ms round "
          f"trips), all exactly once: {section['correct']}\n"
          f"written to {path}; rerun: {section['rerun']}")  # fmt: skip
    return 0 if section["correct"] else 1


if __name__ == "__main__":
    raise SystemExit(main())

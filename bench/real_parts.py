"""The service on production-like parts, hurt while it works: ``REDIS_SHARDS=3 DYNAMODB=local``.

``python -m bench.real_parts`` (``QUICK=1``: shorter windows, a 2,000 hot second) starts the
local stack on a Redis Cluster of 3 masters + 3 replicas and Amazon's DynamoDB Local, as a user
would, and through the public API only (lag = SQS ``SentTimestamp`` - due, what a consumer sees):

- **steady** - timers ``every 1 s`` on every bucket: lag per shard, before anything is hurt;
- **master killed** - the master holding most of those buckets dies (its replica takes over,
  the stack brings the node back as a replica): fires of the other shards throughout (target
  p99 <= 200 ms), fires of its shard due 15 s after the kill and later (target <= 1 s), and
  lost, duplicated, early fires;
- **reshard** - slots of four buckets move to another master while timers fire (MIGRATING,
  IMPORTING, MIGRATE, SETSLOT: ASK and TRYAGAIN meanwhile);
- **flush** - every master flushed while 20 one-shots are due 7-26 s later (target: each within
  2 s of due, none lost);
- **hot second** - 10,000 one-shots of one tenant due in one second, created beyond the
  look-ahead (so the migrator brings them back from their wake listings): drain time.

Each scenario counts every callback of its timers: lost (an expected fire that never came),
duplicated, early.
"""

from __future__ import annotations

import contextlib
import json
import random
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import redis

from bench.common import progress, quick, write_results
from bench.e2e import Callback, Tenant, at, demo_tenant, lag_stats, local_stack, now_ms, wait_for
from ops.local.spec import samconfig
from tests.support.local_stack import admin, real_parts_env
from timers.core.times import format_ms
from timers.engine import keys
from timers.engine.entries import partition_for

BUCKETS = int(samconfig()["parameters"].get("BucketCount", 16))  # as the local stack deploys
SPREAD = 16  # the demo tenant's partitions: every bucket
SLOTS_PER_MIGRATE = 100


class Cluster:
    """The stack's Redis Cluster, seen from outside: who serves which bucket, and the faults."""

    def __init__(self, first_port: int, nodes: int) -> None:
        self.ports = list(range(first_port, first_port + nodes))

    def node(self, port: int) -> redis.Redis:
        return redis.Redis(port=port, socket_timeout=5, decode_responses=True)

    def _view(self) -> list[list[str]]:
        for port in self.ports:
            try:
                text = self.node(port).execute_command("CLUSTER", "NODES")
            except redis.ConnectionError:
                continue
            lines = text if isinstance(text, str) else text.decode()
            return [line.split() for line in lines.splitlines() if line.strip()]
        raise RuntimeError("no node of the cluster answers")

    def masters(self) -> dict[int, str]:
        """port -> node id of each live master."""
        return {int(f[1].split(":")[1].split("@")[0]): f[0] for f in self._view()
                if "master" in f[2] and "fail" not in f[2]}  # fmt: skip

    def owner(self, slot: int) -> int:
        for f in self._view():
            if "master" not in f[2] or "fail" in f[2]:
                continue
            for part in f[8:]:
                low, _, high = part.partition("-")
                if part[0] != "[" and int(low) <= slot <= int(high or low):
                    return int(f[1].split(":")[1].split("@")[0])
        raise RuntimeError(f"no master serves slot {slot}")

    def slot(self, bucket: int) -> int:
        port = next(iter(self.masters()))
        return int(self.node(port).execute_command("CLUSTER", "KEYSLOT", keys.due(bucket)))

    def shard_of(self) -> dict[int, int]:
        """bucket -> the port of the master serving it now."""
        return {b: self.owner(self.slot(b)) for b in range(BUCKETS)}

    def kill(self, port: int) -> None:
        with contextlib.suppress(redis.ConnectionError):  # it goes away while answering
            self.node(port).shutdown(nosave=True)

    def settled(self) -> bool:
        try:
            return all(self.node(p).cluster("INFO")["cluster_state"] == "ok"
                       for p in self.masters())  # fmt: skip
        except redis.RedisError:
            return False

    def flush(self) -> None:
        for port in self.masters():
            self.node(port).flushall()

    def move(self, slot: int, to_port: int) -> None:
        """The slot and its keys to ``to_port``, as redis-cli --cluster reshard does."""
        masters = self.masters()
        source_port = self.owner(slot)
        source, target = self.node(source_port), self.node(to_port)
        target.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", masters[source_port])
        source.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", masters[to_port])
        while keys_left := source.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100):
            source.execute_command("MIGRATE", "127.0.0.1", to_port, "", 0, 5000, "KEYS", *keys_left)
        for port in (
            to_port,
            source_port,
            *(p for p in masters if p not in (to_port, source_port)),
        ):
            self.node(port).execute_command("CLUSTER", "SETSLOT", slot, "NODE", masters[to_port])


def bucket_of(timer_id: str, tenant: str = "demo") -> int:
    return partition_for(tenant, timer_id, SPREAD) % BUCKETS


def every_second(a: Tenant, n: int, lead_s: int = 3) -> list[str]:
    first = (now_ms() // 1000 + lead_s) * 1000
    phases = random.Random(n).sample(range(1000), n)
    return a.create_batch([{"schedule": {"type": "every", "seconds": 1},
                            "start_at": format_ms(first + p), "payload": {"bench": True}}
                           for p in phases])  # fmt: skip


def expected_fires(ids: Sequence[str], callbacks: list[Callback], start: int, end: int) -> int:
    """Fires due in [start, end) of timers every second: one per timer and second (a timer's
    phase from any callback of it)."""
    phases = {c.timer_id: c.scheduled % 1000 for c in callbacks}
    return sum(len(range((start - phases[t] + 999) // 1000, (end - phases[t] + 999) // 1000))
               for t in ids if t in phases)  # fmt: skip


def outcome(callbacks: list[Callback], duplicates: int, expected: int) -> dict[str, Any]:
    return {"fires": len(callbacks), "expected": expected,
            "lost": max(0, expected - len(callbacks)), "duplicated": duplicates,
            "early": sum(1 for c in callbacks if c.sent < c.scheduled),
            "sent_lag_ms": lag_stats([c.sent - c.scheduled for c in callbacks])}  # fmt: skip


def window(a: Tenant, ids: list[str], start: int, end: int,
           where: Callable[[str], bool] = lambda _: True) -> dict[str, Any]:  # fmt: skip
    """The fires of the timers ``where`` picks (by id) due in [start, end)."""
    chosen = [t for t in ids if where(t)]
    callbacks, duplicates = a.consumer.of(set(chosen))
    inside = [c for c in callbacks if start <= c.scheduled < end]
    return outcome(inside, duplicates, expected_fires(chosen, callbacks, start, end))


def master_killed(a: Tenant, cluster: Cluster, run_s: int) -> dict[str, Any]:
    ids = every_second(a, 48)
    time.sleep(15)  # warm sandboxes on every bucket
    shards = cluster.shard_of()
    per_master: dict[int, int] = defaultdict(int)
    for timer_id in ids:
        per_master[shards[bucket_of(timer_id)]] += 1
    victim = max(per_master, key=lambda p: per_master[p])
    killed_at = now_ms()
    cluster.kill(victim)
    progress(f"real parts: killed master {victim} (serving {per_master[victim]} of the timers)")
    settled = wait_for(cluster.settled, 30)
    settled_ms = now_ms() - killed_at
    time.sleep(max(0, run_s - settled_ms / 1000))
    end = now_ms() - 2_000
    time.sleep(3)
    hit = lambda t: shards[bucket_of(t)] == victim  # noqa: E731
    spared = lambda t: not hit(t)  # noqa: E731
    result = {
        "killed_port": victim, "failover_settled_ms": settled_ms if settled else None,
        "other_shards": window(a, ids, killed_at, end, spared),
        "its_shard_from_15_s": window(a, ids, killed_at + 15_000, end, hit),
        "its_shard_throughout": window(a, ids, killed_at, end, hit),
    }  # fmt: skip
    for timer_id in ids:
        a.call("DELETE", f"/timers/{timer_id}")
    return result


def reshard(a: Tenant, cluster: Cluster, run_s: int) -> dict[str, Any]:
    ids = every_second(a, 32)
    time.sleep(8)
    start = now_ms()
    shards = cluster.shard_of()
    moved = sorted({bucket_of(t) for t in ids})[:4]
    for bucket in moved:
        target = next(p for p in cluster.masters() if p != shards[bucket])
        cluster.move(cluster.slot(bucket), target)
    moved_ms = now_ms() - start
    time.sleep(max(0, run_s - moved_ms / 1000))
    end = now_ms() - 2_000
    time.sleep(3)
    result = {"buckets_moved": moved, "moving_took_ms": moved_ms, **window(a, ids, start, end)}
    for timer_id in ids:
        a.call("DELETE", f"/timers/{timer_id}")
    return result


def flush(a: Tenant, cluster: Cluster) -> dict[str, Any]:
    flush_at = (now_ms() // 1000 + 4) * 1000
    rng = random.Random(20)
    dues = [flush_at + 5_000 + rng.randrange(21_000) for _ in range(20)]
    ids = [a.call("POST", "/timers", at(due))["id"] for due in dues]
    time.sleep(max(0.0, (flush_at - now_ms()) / 1000))
    flushed = now_ms()
    cluster.flush()
    wait_for(lambda: len(a.consumer.of(set(ids))[0]) == len(ids), 60)
    callbacks, duplicates = a.consumer.of(set(ids))
    return {"one_shots": len(ids), "due_after_flush_s": [5, 26], "flushed_at_ms": flushed,
            **outcome(callbacks, duplicates, len(ids))}  # fmt: skip


def hot_second_ahead(a: Tenant, n: int, ahead_s: int) -> dict[str, Any]:
    due = (now_ms() // 1000 + ahead_s) * 1000
    ids = set(a.create_batch([at(due) for _ in range(n)]))
    progress(f"real parts: {n:,} one-shots created, due in {(due - now_ms()) // 1000} s")
    time.sleep(max(0.0, (due - now_ms()) / 1000))
    drained = wait_for(lambda: len(a.consumer.of(ids)[0]) == n, 300)
    callbacks, duplicates = a.consumer.of(ids)
    last = max((c.sent for c in callbacks), default=due)
    return {"n": n, "created_ahead_s": ahead_s, "drained": drained,
            "last_sent_after_due_s": round((last - due) / 1000, 2),
            **outcome(callbacks, duplicates, n)}  # fmt: skip


def main() -> int:
    short = quick()
    env = real_parts_env(3)
    out: dict[str, Any] = {"quick": short, "stack": "REDIS_SHARDS=3 DYNAMODB=local"}
    with local_stack("real_parts", **env) as stack:
        admin(stack, "tenant", "spread", "demo", str(SPREAD))
        a = demo_tenant(stack)
        cluster = Cluster(int(env["REDIS_PORT"]), 6)
        progress("real parts: steady, 48 timers every 1 s over every bucket")
        ids = every_second(a, 48)
        time.sleep(15)
        start = now_ms()
        time.sleep(20 if short else 40)
        out["steady"] = window(a, ids, start, now_ms() - 2_000)
        for timer_id in ids:
            a.call("DELETE", f"/timers/{timer_id}")
        progress(f"real parts: steady {out['steady']['sent_lag_ms']}")
        out["master_killed"] = master_killed(a, cluster, 30 if short else 45)
        progress(f"real parts: master killed {json.dumps(out['master_killed'])}")
        out["reshard"] = reshard(a, cluster, 20 if short else 30)
        progress(f"real parts: reshard {json.dumps(out['reshard'])}")
        out["flush"] = flush(a, cluster)
        progress(f"real parts: flush {json.dumps(out['flush'])}")
        n = 2_000 if short else 10_000
        out["hot_second"] = hot_second_ahead(a, n, 180)
        progress(f"real parts: hot second {json.dumps(out['hot_second'])}")
        a.consumer.stop()
    out["rerun"] = "python -m bench.real_parts" + (" (QUICK=1)" if short else "")
    path = write_results("real_parts", out)
    print(json.dumps({k: v for k, v in out.items() if k != "rerun"}, indent=1))
    print(f"written to {path}; rerun: {out['rerun']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

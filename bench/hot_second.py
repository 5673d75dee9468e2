"""The hot second: 50,000 one-shots of one tenant due in the same millisecond, drained by the
real trigger (lease, claim, send, record, finish) on a real redis-server and moto's DynamoDB.

This is the shape that broke the claim items (issue 16, defect 2): one tenant's fires of one
second share ``spread`` (8) claim partitions, so ~6,250 positions land in one partition-second -
past DynamoDB's 400 KB item limit for the first fire path. Here every fire must go out once,
nothing may stay in Redis, and no claim item may hold more than ``CLAIM_CAP`` entries (its
path goes as deep as the second needs). ``python -m bench.hot_second`` (``QUICK=1``: 10,000);
``make bench`` runs it with the engine benchmark and writes ``engine.hot_second``.

SQS is a sink (the trigger's batching is measured by the e2e benchmark); the clock is injected,
so the seconds reported are the work, not waits.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import boto3
import redis
from moto import mock_aws

from bench.common import last_results, progress, quick, write_results
from ops import template
from ops.aws_limits import aws_limits
from ops.offline import use_fake_aws
from ops.redis_server import RedisServer
from tests.support.clock import FakeClock
from timers.api.creating import TimerSpec
from timers.core.schedule import AtSchedule
from timers.engine.index import BucketIndex
from timers.engine.log import CLAIM_CAP
from timers.engine.trigger import run_trigger
from timers.runtime import build_runtime, trigger_deps

TENANT = "hot"
BATCH = 100


class Sink:
    def __init__(self) -> None:
        self.fired: Counter[str] = Counter()

    def send_message_batch(self, *, QueueUrl: str, Entries: Sequence[Any]) -> Any:
        self.fired.update(json.loads(e["MessageBody"])["fire_id"] for e in Entries)
        return {"Successful": [{"Id": e["Id"]} for e in Entries], "Failed": []}


def drain_hot_second(n: int, redis_url: str) -> dict[str, Any]:
    use_fake_aws()
    with mock_aws(), aws_limits():
        dynamodb = boto3.client("dynamodb")
        template.create_tables(dynamodb)
        clock = FakeClock()
        conn = redis.Redis.from_url(redis_url, decode_responses=True)
        conn.flushall()
        settings = template.local_settings()
        runtime = build_runtime(settings, clock, redis_conn=conn, reference=clock)
        runtime.tenants.put_tenant(TENANT, "https://sqs.us-east-1.amazonaws.com/1/hot", clock())
        tenant = runtime.tenants.get_tenant(TENANT)
        assert tenant is not None
        service = runtime.service
        index = runtime.wiring.index
        due = clock() + 60_000
        started = time.monotonic()
        for start in range(0, n, BATCH):
            specs = [TimerSpec(schedule=AtSchedule(due), payload_json=str(i))
                     for i in range(start, min(n, start + BATCH))]  # fmt: skip
            service.create_batch(tenant, specs, None)
        created_s = time.monotonic() - started
        progress(f"hot second: {n:,} one-shots due together, created in {created_s:.0f} s")
        sink = Sink()
        deps = trigger_deps(runtime.wiring, sqs=sink, clock=clock, reference=clock,
                            monotonic=None, sleep=clock.sleep)  # fmt: skip
        clock.now = due
        started, runs = time.monotonic(), 0
        while buckets := due_buckets(index, clock()):
            for bucket in buckets:
                run_trigger(deps, bucket, 900_000)
                runs += 1
        drained_s = time.monotonic() - started
        items = dynamodb.scan(TableName=settings.claims_table)["Items"]
        sizes = [len(json.dumps(item)) for item in items]
        entries = [sum("@" in name for name in item) for item in items]
        left = sum(len(index.cards(bucket)) for bucket in range(index.bucket_count))
    return {
        "timers": n,
        "fired_once": sum(1 for c in sink.fired.values() if c == 1),
        "duplicated": sum(c - 1 for c in sink.fired.values()),
        "missing": n - len(sink.fired),
        "left_in_redis": left,
        "drained": len(sink.fired) == n and left == 0,
        "create_seconds": round(created_s, 1),
        "drain_seconds": round(drained_s, 1),
        "trigger_runs": runs,
        "claim_items": len(items),
        "claim_cap": CLAIM_CAP,
        "max_entries_per_item": max(entries, default=0),
        "max_item_kb": round(max(sizes, default=0) / 1024, 1),
        "deepest_item": max((item["k"]["S"].count("/") - 1 for item in items), default=0),
    }


def due_buckets(index: BucketIndex, now: int) -> list[int]:
    peeks = index.peek(range(index.bucket_count), now + 250)
    return sorted(b for b, p in peeks.items() if not isinstance(p, Exception) and p.backlog)


def main() -> int:
    n = 10_000 if quick() else 50_000
    server = RedisServer.start(new_session=True)
    try:
        result = drain_hot_second(n, server.url)
    finally:
        server.stop()
    result["rerun"] = "python -m bench.hot_second" + (" (QUICK=1)" if quick() else "")
    engine = last_results("engine")
    write_results("engine", {**engine, "hot_second": result})
    print(f"hot second: {result}")
    return 0 if result["drained"] and not result["duplicated"] else 1


if __name__ == "__main__":
    raise SystemExit(main())

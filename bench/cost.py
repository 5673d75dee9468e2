"""Cost benchmark: what one fire, one create and one idle month cost at on-demand list prices.

``python -m bench.cost`` runs the deployed shape in-process on one injected clock, against moto
(DynamoDB, SQS) and a real redis-server: the api handler with HTTP API events, the migrator
handler every minute, the fan-out polling every 25 ms, and the trigger handler for every run
it starts (armed runs wait for due instants by advancing the clock). It counts what
``bench.meter`` describes - DynamoDB units by the rules, SQS requests, Lambda invocations, HTTP
API requests, Redis round trips and commands, bytes logged - and prices them. Each scenario is
measured over whole minutes with the idle minutes subtracted: what the fires add. Lambda
durations are stated (moto is not DynamoDB), see ASSUMPTIONS.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ops.offline import use_fake_aws

use_fake_aws()  # never reach a real account, whatever the shell has: moto only
warnings.filterwarnings("ignore", message="No application metrics to publish")

import boto3  # noqa: E402
import redis  # noqa: E402
from moto import mock_aws  # noqa: E402

from bench.common import progress, quick, write_results  # noqa: E402
from bench.meter import (  # noqa: E402
    CountingConnection,
    DynamoHooks,
    Meter,
    SqsHooks,
    captured_stdout,
    redis_commands,
    table_specs,
)
from functions.api import app as api_app  # noqa: E402
from functions.migrator import app as migrator_app  # noqa: E402
from functions.trigger import app as trigger_app  # noqa: E402
from ops import admin, template  # noqa: E402
from ops.local.context import LambdaContext  # noqa: E402
from ops.redis_server import RedisServer  # noqa: E402
from tests.support.clock import FakeClock  # noqa: E402
from timers.adapters import idempotency, tenants, timers_table, wakeups  # noqa: E402
from timers.adapters.redis_index import RedisIndex  # noqa: E402
from timers.core.chain import CHECKPOINT_EVERY  # noqa: E402
from timers.core.times import format_ms  # noqa: E402
from timers.fanout import MAX_RUN_MS, POLL_MS, Fanout  # noqa: E402
from timers.firing import LEASE_LIMIT, TriggerDeps  # noqa: E402
from timers.runtime import DAY_MS, build_runtime, fanout_deps, migrator_deps  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
T0 = 1_795_255_140_000  # 2026-11-21T09:59:00Z: a minute boundary
TENANT = "acme"
PAYLOAD = {"order": 123456, "action": "remind", "note": "a typical small callback payload"}
BIG_PAYLOAD = {"blob": "x" * (60 * 1024)}  # near the 64 KiB limit
MINUTES_PER_MONTH = 730 * 60  # AWS bills a month as 730 hours

PRICES_AS_OF = "2025-06"
"""The list prices as the author knew them then (DynamoDB on-demand as cut on 2024-11-01). The
benchmark has no internet access: verify on the pricing pages before quoting a figure."""


def _p(usd: float, per: str, as_of: str = PRICES_AS_OF) -> dict[str, Any]:
    return {"usd": usd, "per": per, "as_of": as_of}


PRICES: dict[str, dict[str, Any]] = {
    "dynamodb_write_request_unit": _p(0.625e-6, "WRU, on-demand", "2024-11-01"),
    "dynamodb_read_request_unit": _p(0.125e-6, "RRU, on-demand", "2024-11-01"),
    "dynamodb_storage_gb_month": _p(0.25, "GB-month, Standard table class"),
    "sqs_request": _p(0.40e-6, "standard queue request (each 64 KB chunk)"),
    "lambda_request": _p(0.20e-6, "invocation"),
    "lambda_gb_second_arm64": _p(0.0000133334, "GB-second, arm64"),
    "api_gateway_http_request": _p(1.00e-6, "HTTP API request, per 512 KB (first 300 M a month)"),
    "elasticache_serverless_valkey_ecpu": _p(0.0023e-6, "ECPU"),
    "elasticache_serverless_valkey_storage_gb_hour": _p(0.084, "GB-hour, 100 MB minimum"),
    "vpc_interface_endpoint_hour": _p(0.01, "endpoint per AZ per hour"),
    "vpc_interface_endpoint_gb": _p(0.01, "GB processed"),
    "cloudwatch_logs_ingest_gb": _p(0.50, "GB ingested (standard log class)"),
    "xray_trace_recorded": _p(5.00e-6, "trace recorded"),
}


def price(name: str) -> float:
    return float(PRICES[name]["usd"])


ASSUMPTIONS: dict[str, Any] = {
    "api_ms": 40,  # a warm create or batch of creates: validation, 1-3 DynamoDB calls, Redis
    "api_per_timer_ms": 1,  # each timer of a batch: build, serialize, its share of the writes
    "trigger_wait_ms": 150,  # an armed run is started LEAD_MS (200) early, minus ~50 ms invoke
    "trigger_base_ms": 40,  # clock sync, lease, one claim and one record write, finish
    "trigger_per_fire_ms": 1,  # its share of claims, SendMessageBatch and records
    "migrator_ms": 1_000,
    "fanout_ms": MAX_RUN_MS,  # each run polls for 70 s and is billed for all of it
    "lambda_platform_log_bytes": 400,  # START, END and REPORT lines of every invocation
    "api_access_log_bytes": 180,  # the HTTP API's access log line (template.yaml), with overhead
    "xray_sampled_share": 0.05,  # the api only (the trigger and fan-out pass through)
    "ecpu_per_command": 1,  # each command executed, scripts' inner calls included
    "endpoint_bytes_per_sqs_byte": 2.0,  # request plus response and TLS/HTTP overhead
    "interface_endpoints": 2,  # SQS, Lambda
    "availability_zones": 2,
    "cache_min_storage_gb": 0.1,
    "checkpoint_wru": 3,  # a checkpoint: the timer item (<= 1 KB) and its index entry moving
    "fire_record_bytes": 80,  # a claim entry, kept FireRetentionDays: ~a month of fires stored
}


def memory_gb() -> dict[str, float]:
    """Each function's memory from template.yaml (Globals as the default)."""
    default = template.load().get("Globals", {}).get("Function", {}).get("MemorySize", 128)
    fns = template.resources("AWS::Serverless::Function")
    names = {"api": "ApiFunction", "migrator": "MigratorFunction"}
    names |= {"fanout": "FanoutFunction", "trigger": "TriggerFunction"}
    return {k: int(fns[v].get("MemorySize", default)) / 1024 for k, v in names.items()}


# ---------------------------------------------------------------- the deployment, in-process


@dataclass
class Stack:
    """What EventBridge, API Gateway and Lambda would do, poll by poll, on one clock."""

    meter: Meter
    redis_url: str
    log_bytes: Callable[[], int]
    clock: FakeClock = field(default_factory=lambda: FakeClock(T0))
    invoked: list[dict[str, Any]] = field(default_factory=list)
    received: Counter[str] = field(default_factory=Counter)
    early: int = 0
    runs: int = 0

    def __post_init__(self) -> None:
        settings = template.local_settings()
        template.create_tables(boto3.client("dynamodb"))
        pool = redis.ConnectionPool.from_url(
            self.redis_url, connection_class=CountingConnection, decode_responses=True
        )
        conn = redis.Redis(connection_pool=pool)
        self.admin_redis = redis.Redis.from_url(self.redis_url, decode_responses=True)
        self.admin_redis.flushall()
        self.raw_sqs = boto3.client("sqs")  # uncounted: setup and the consumer's reads
        created = admin.create_tenant(admin.Target(settings, self.raw_sqs), TENANT)
        self.api_key, self.queue_url = created["api_key"], created["callback_queue_url"]
        self.runtime = build_runtime(settings, self.clock, redis_conn=conn)
        service = self.runtime.service

        names = {lid: getattr(settings, f) for lid, f in template.TABLE_SETTINGS.items()}
        dynamo = DynamoHooks(self.meter, boto3.client("dynamodb"), table_specs(names))
        models = (timers_table.TimerItem, timers_table.PayloadItem, wakeups.WakeupItem)
        models += (idempotency.IdempotencyItem, tenants.TenantItem, tenants.ApiKeyItem)  # type: ignore[assignment]
        for model in models:
            dynamo.register(model._get_connection().connection.client)
        dynamo.register(service.claims.client)
        dynamo.register(service.timers.client)
        sqs = boto3.client("sqs")
        SqsHooks(self.meter).register(sqs)

        index: RedisIndex = service.index  # type: ignore[assignment]
        lookahead = settings.lookahead_seconds * 1000

        def sleep(seconds: float) -> None:  # an armed run's wait moves the clock
            self.clock.advance(max(1, math.ceil(seconds * 1000)))

        self.trigger_deps = TriggerDeps(
            index=index, claims=service.claims, timers=service.timers, sqs=sqs,
            clock=self.clock, reference=self.clock, lookahead_ms=lookahead,
            retention_ms=settings.fire_retention_days * DAY_MS, sleep=sleep,
        )  # fmt: skip
        self.migrator_deps = migrator_deps(
            settings, conn, service.timers, service.claims, service.wakeups, index=index
        )
        self.fanout = Fanout(
            fanout_deps(settings, conn, self._invoke, self.clock, sleep, index=index)
        )
        # The real handlers with our clients and clock (they build their deps once per cold
        # start; these stand in for that build).
        api_app.runtime = lambda: self.runtime  # type: ignore[assignment]
        trigger_app.deps = lambda: self.trigger_deps  # type: ignore[assignment]
        migrator_app.deps = lambda: self.migrator_deps  # type: ignore[assignment]
        migrator_app.clock = self.clock
        self._event = json.loads((ROOT / "events" / "api-create-timer.json").read_text())
        conn.ping()  # a warm Lambda's connection is already open
        self._minute = -1

    def _invoke(self, FunctionName: str, InvocationType: str, Payload: bytes) -> None:
        self.invoked.append(json.loads(Payload))

    def _lambda(self, name: str, timeout_s: float) -> LambdaContext:
        self.meter.add(f"lambda.{name}")
        return LambdaContext(function_name=name, timeout_s=timeout_s)

    def run(self, seconds: float) -> None:
        """Let the deployment run: the minute's scheduled starts, the fan-out's polls, the
        trigger runs they start, the tenant's consumer reading its queue each second."""
        end = self.clock() + int(seconds * 1000)
        read_at = self.clock()
        while self.clock() < end:
            if self.clock() // 60_000 != self._minute:
                self._minute = self.clock() // 60_000
                migrator_app.handler({}, self._lambda("migrator", 55))
                self.meter.add("lambda.fanout")  # one 70 s run a minute (the loop is ours)
            self.fanout.act()
            while self.invoked:
                trigger_app.handler(self.invoked.pop(0), self._lambda("trigger", 30))
                self.runs += 1
            if self.clock() - read_at >= 1_000:
                read_at = self.clock()
                self._consume()
            self.clock.advance(POLL_MS)
        self._consume()

    def _consume(self) -> None:
        while got := self.raw_sqs.receive_message(
            QueueUrl=self.queue_url, MaxNumberOfMessages=10
        ).get("Messages", []):
            for message in got:
                body = json.loads(message["Body"])
                self.received[body["fire_id"]] += 1
                self.early += body["fired_at"] < body["scheduled_at"]
            self.raw_sqs.delete_message_batch(
                QueueUrl=self.queue_url,
                Entries=[
                    {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(got)
                ],
            )

    def call(self, method: str, path: str, body: Any = None) -> Any:
        """One request through an HTTP API event and the api handler."""
        event = copy.deepcopy(self._event)
        event["headers"] = {"content-type": "application/json", "x-api-key": self.api_key}
        event["rawPath"] = event["requestContext"]["http"]["path"] = path
        event["requestContext"]["http"]["method"] = method
        event["routeKey"] = event["requestContext"]["routeKey"] = f"{method} {path}"
        event["body"] = None if body is None else json.dumps(body)
        event["requestContext"]["timeEpoch"] = self.clock()
        self.meter.add("apigw.requests")
        result = api_app.handler(event, self._lambda("api", 10))
        if result["statusCode"] >= 300:
            raise RuntimeError(f"{method} {path}: {result['statusCode']} {result.get('body')}")
        return json.loads(result["body"]) if result.get("body") else None

    def create(self, timer: dict[str, Any]) -> str:
        return str(self.call("POST", "/v1/timers", timer)["id"])

    def create_batch(self, timers: list[dict[str, Any]]) -> list[str]:
        """Batch creates of up to 100 timers, as many as fit the 256 KiB request body."""
        size = max(len(json.dumps(t)) for t in timers)
        per = max(1, min(100, 250_000 // size))
        ids: list[str] = []
        for start in range(0, len(timers), per):
            self.clock.advance(25)  # 40 requests a second: under the tenant's rate limit
            reply = self.call("POST", "/v1/timers:batch", {"timers": timers[start : start + per]})
            ids += [t["id"] for t in reply["items"]]
        return ids

    def delete(self, ids: list[str]) -> None:
        for timer_id in ids:
            self.runtime.service.delete(tenants.get_tenant(TENANT), timer_id)  # type: ignore[arg-type]

    def snapshot(self) -> dict[str, float]:
        counts = self.meter.snapshot()
        counts["redis.round_trips"] = CountingConnection.round_trips
        counts["redis.commands"] = redis_commands(self.admin_redis)
        counts["log.bytes"] = self.log_bytes()
        counts["fires"] = sum(self.received.values())
        counts["trigger.runs"] = self.runs
        return counts

    def measure(self, seconds: float, before: Callable[[], Any] | None = None) -> Window:
        start = self.snapshot()
        if before is not None:
            before()
        self.run(seconds)
        end = self.snapshot()
        return Window(seconds / 60, {k: end.get(k, 0) - start.get(k, 0) for k in end})


@dataclass(frozen=True)
class Window:
    minutes: float
    counts: dict[str, float]

    def minus(self, idle_per_minute: dict[str, float]) -> dict[str, float]:
        """What the scenario added over an idle deployment running as long."""
        keep = ("fires", "trigger.runs")
        return {k: v - (0 if k in keep else self.minutes * idle_per_minute.get(k, 0))
                for k, v in self.counts.items()}  # fmt: skip


# ---------------------------------------------------------------- scenarios


def at(ms: int, payload: Any = PAYLOAD) -> dict[str, Any]:
    return {"name": "bench", "schedule": {"type": "at", "at": format_ms(ms)}, "payload": payload}


def every(seconds: int, start_ms: int, payload: Any = PAYLOAD) -> dict[str, Any]:
    return {"name": "bench", "schedule": {"type": "every", "seconds": seconds},
            "start_at": format_ms(start_ms), "payload": payload}  # fmt: skip


@dataclass
class Scenario:
    name: str
    description: str
    added: dict[str, float]
    expected_fires: int
    recurring: bool = False

    @property
    def fires(self) -> int:
        return int(self.added["fires"])

    def per_fire(self) -> dict[str, float]:
        per = {k: v / max(1, self.fires) for k, v in self.added.items()}
        per["creates"] = 0.0 if self.recurring else 1.0  # a one-shot's fire pays its create
        if self.recurring:  # a checkpoint every CHECKPOINT_EVERY fires (too rare to wait for)
            per["dynamodb.wru.checkpoint"] = ASSUMPTIONS["checkpoint_wru"] / CHECKPOINT_EVERY
        return per


def next_minute(stack: Stack, plus_s: int = 0) -> int:
    return (stack.clock() // 60_000 + 1) * 60_000 + plus_s * 1000


def run_scenarios(stack: Stack, burst: int) -> tuple[dict[str, float], list[Scenario]]:
    progress("cost: warming up, then two idle minutes")
    stack.run(60)
    idle_window = stack.measure(120)
    idle = {k: v / idle_window.minutes for k, v in idle_window.counts.items()}
    out: list[Scenario] = []

    def recurring(name: str, count: int, payload: Any, description: str) -> None:
        start = next_minute(stack, 30)
        ids: list[str] = []
        stack.run(1)
        ids = stack.create_batch([every(60, start, payload) for _ in range(count)])
        while stack.clock() < start + 1_000:  # the first fires chain the next ones
            stack.run(1)
        window = stack.measure(120)
        out.append(Scenario(name, description, window.minus(idle), 2 * count, recurring=True))
        stack.delete(ids)
        stack.run(2)

    progress(f"cost: {burst} recurring timers due together (one tenant), two minutes")
    recurring("recurring_batched", burst, PAYLOAD,
              f"{burst} timers every 60 s sharing a start, one tenant (spread 8): ~{burst // 8} "
              "fires per trigger run and claim item; creation excluded")  # fmt: skip
    progress("cost: the same with a 60 KiB payload")
    recurring("recurring_batched_64k", burst, BIG_PAYLOAD,
              "the same with a 60 KiB payload: DynamoDB units must not grow with it")  # fmt: skip

    progress("cost: 30 recurring timers, each alone in its second")
    base = next_minute(stack)
    ids = [stack.create(every(60, base + 60_000 + i * 2_000)) for i in range(30)]
    stack.run(60 + 61)
    window = stack.measure(120)
    out.append(Scenario("recurring_alone", "30 timers every 60 s at distinct seconds",
                        window.minus(idle), 60, recurring=True))  # fmt: skip
    stack.delete(ids)

    progress(f"cost: {burst * 4} one-shots made by batch creates, due together")
    due = next_minute(stack, 90)
    n = burst * 4
    window = stack.measure(
        (due - stack.clock() + 30_000) / 1000,
        lambda: stack.create_batch([at(due) for _ in range(n)]),
    )
    out.append(Scenario("one_shot_batch_create", f"{n} one-shots created 100 per request "
                        "(POST /v1/timers:batch), all due in the same second; the creates "
                        "included", window.minus(idle), n))  # fmt: skip

    progress("cost: 40 one-shots created one by one, each firing alone")
    start = stack.clock()

    def singles() -> None:
        for i in range(40):  # half via the api's fast path, half (150 s away) via the migrator
            stack.create(at(start + (30_000 if i % 2 else 150_000) + i * 1_000))

    window = stack.measure(240, singles)
    out.append(Scenario("one_shot", "40 one-shots created one by one (POST /v1/timers), each "
                        "firing alone in its second; the creates included", window.minus(idle),
                        40))  # fmt: skip
    return idle, out


# ---------------------------------------------------------------- dollars


def fire_dollars(per: dict[str, float], mem: dict[str, float]) -> dict[str, float]:
    """US$ per million fires, by line item."""
    a = ASSUMPTIONS
    runs, api = per.get("lambda.trigger", 0), per.get("lambda.api", 0)
    trigger_s = (
        runs * (a["trigger_wait_ms"] + a["trigger_base_ms"]) + a["trigger_per_fire_ms"]
    ) / 1000
    api_s = (api * a["api_ms"] + per.get("creates", 0) * a["api_per_timer_ms"]) / 1000
    gb_s = trigger_s * mem["trigger"] + api_s * mem["api"]
    logs = (
        per.get("log.bytes", 0)
        + (runs + api) * a["lambda_platform_log_bytes"]
        + per.get("apigw.requests", 0) * a["api_access_log_bytes"]
    )
    wru = (per.get("dynamodb.wru.table", 0) + per.get("dynamodb.wru.gsi", 0)
           + per.get("dynamodb.wru.checkpoint", 0))  # fmt: skip
    lines = {
        "dynamodb_writes": wru * price("dynamodb_write_request_unit"),
        "dynamodb_reads": per.get("dynamodb.rru", 0) * price("dynamodb_read_request_unit"),
        "dynamodb_fire_history_storage": a["fire_record_bytes"]
        / 1e9
        * price("dynamodb_storage_gb_month"),
        "sqs": per.get("sqs.requests", 0) * price("sqs_request"),
        "lambda_requests": (runs + api) * price("lambda_request"),
        "lambda_duration": gb_s * price("lambda_gb_second_arm64"),
        "api_gateway": per.get("apigw.requests", 0) * price("api_gateway_http_request"),
        "elasticache_ecpu": per.get("redis.commands", 0)
        * a["ecpu_per_command"]
        * price("elasticache_serverless_valkey_ecpu"),
        "cloudwatch_logs": logs / 1e9 * price("cloudwatch_logs_ingest_gb"),
        "xray": per.get("apigw.requests", 0)
        * a["xray_sampled_share"]
        * price("xray_trace_recorded"),
        "vpc_endpoint_data": per.get("sqs.payload_bytes", 0)
        * a["endpoint_bytes_per_sqs_byte"]
        / 1e9
        * price("vpc_interface_endpoint_gb"),
    }
    return {k: round(v * 1e6, 4) for k, v in lines.items()}


def idle_month(idle: dict[str, float], mem: dict[str, float]) -> dict[str, float]:
    """US$ per month of a deployment with nothing to fire, by line item."""
    a, mins = ASSUMPTIONS, MINUTES_PER_MONTH
    hours = mins / 60
    starts = idle.get("lambda.fanout", 0) + idle.get("lambda.migrator", 0)
    fanout_gb_s = idle.get("lambda.fanout", 0) * a["fanout_ms"] / 1000 * mem["fanout"]
    gb_s = fanout_gb_s + idle.get("lambda.migrator", 0) * a["migrator_ms"] / 1000 * mem["migrator"]
    lines = {
        "vpc_interface_endpoints": a["interface_endpoints"]
        * a["availability_zones"]
        * hours
        * price("vpc_interface_endpoint_hour"),
        "elasticache_storage_minimum": a["cache_min_storage_gb"]
        * hours
        * price("elasticache_serverless_valkey_storage_gb_hour"),
        "elasticache_ecpu": idle.get("redis.commands", 0)
        * mins
        * a["ecpu_per_command"]
        * price("elasticache_serverless_valkey_ecpu"),
        "lambda_duration": gb_s * mins * price("lambda_gb_second_arm64"),
        "lambda_requests": starts * mins * price("lambda_request"),
        "dynamodb_reads": idle.get("dynamodb.rru", 0) * mins * price("dynamodb_read_request_unit"),
        "dynamodb_writes": (idle.get("dynamodb.wru.table", 0) + idle.get("dynamodb.wru.gsi", 0))
        * mins
        * price("dynamodb_write_request_unit"),
        "cloudwatch_logs": (idle.get("log.bytes", 0) + starts * a["lambda_platform_log_bytes"])
        * mins
        / 1e9
        * price("cloudwatch_logs_ingest_gb"),
    }
    return {k: round(v, 2) for k, v in lines.items()}


UNITS = {  # what the report shows per fire, from the counters
    "wru": ("dynamodb.wru.table", "dynamodb.wru.gsi", "dynamodb.wru.checkpoint"),
    "wru_claims": ("dynamodb.wru.ClaimsTable",),
    "wru_timers": ("dynamodb.wru.TimersTable",),
    "wru_wakeups": ("dynamodb.wru.WakeupsTable",),
    "wru_gsi": ("dynamodb.wru.gsi",),
    "wru_checkpoints": ("dynamodb.wru.checkpoint",),
    "rru": ("dynamodb.rru",),
    "sqs_requests": ("sqs.requests",),
    "lambda_trigger_runs": ("lambda.trigger",),
    "lambda_api_invocations": ("lambda.api",),
    "api_requests": ("apigw.requests",),
    "redis_round_trips": ("redis.round_trips",),
    "redis_commands": ("redis.commands",),
    "log_bytes": ("log.bytes",),
}


def units(per: dict[str, float]) -> dict[str, float]:
    return {name: round(sum(per.get(k, 0) for k in keys), 4) for name, keys in UNITS.items()}


def main(argv: list[str] | None = None) -> int:
    short = quick()
    parser = argparse.ArgumentParser(prog="python -m bench.cost", description=__doc__)
    parser.add_argument("--burst", type=int, default=128 if short else 256)
    args = parser.parse_args(argv)
    mem = memory_gb()
    progress("cost benchmark: moto + a real redis-server, the real handlers on one clock")
    server = RedisServer.start(new_session=True)
    try:
        with mock_aws(), captured_stdout() as log_bytes:
            stack = Stack(Meter(), server.url, log_bytes)
            idle, scenarios = run_scenarios(stack, args.burst)
    finally:
        server.stop()
    duplicates = sum(n - 1 for n in stack.received.values() if n > 1)
    results: dict[str, Any] = {}
    for sc in scenarios:
        per = sc.per_fire()
        dollars = fire_dollars(per, mem)
        results[sc.name] = {
            "description": sc.description,
            "fires": sc.fires,
            "expected_fires": sc.expected_fires,
            "fires_per_trigger_run": round(sc.fires / max(1, sc.added.get("trigger.runs", 0)), 1),
            "units_per_fire": units(per),
            "usd_per_million_fires": round(sum(dollars.values()), 3),
            "usd_per_million_fires_by_item": dollars,
        }
        progress(f"cost: {sc.name}: ${sum(dollars.values()):.3f}/M fires; {units(per)}")
    idle_lines = idle_month(idle, mem)
    per_m = {name: r["usd_per_million_fires"] for name, r in results.items()}
    section: dict[str, Any] = {
        "usd_per_million_fires": per_m,
        "wru_per_fire": {name: r["units_per_fire"]["wru"] for name, r in results.items()},
        "usd_per_idle_month": round(sum(idle_lines.values()), 2),
        "usd_per_idle_month_by_item": idle_lines,
        "units_per_idle_minute": units(idle),
        "scenarios": results,
        "targets_usd_per_million": {"recurring_batched": 0.30, "one_shot_batch_create": 0.80},
        "compare_usd_per_million": {"eventbridge_scheduler": 1.00, "cloud_tasks": 0.40},
        "checks": {
            "every_fire_delivered": all(s.fires == s.expected_fires for s in scenarios),
            "duplicates": duplicates,
            "early": stack.early,
        },
        "prices": PRICES,
        "prices_as_of": PRICES_AS_OF,
        "assumptions": ASSUMPTIONS,
        "memory_gb": mem,
        "lease_limit": LEASE_LIMIT,
        "quick": short,
        "rerun": "make bench" + (" QUICK=1" if short else "") + "  (or python -m bench.cost)",
    }
    path = write_results("cost", section)
    print("cost per million fires: " + ", ".join(f"{k} ${v:.3f}" for k, v in per_m.items())
          + f"; idle ${section['usd_per_idle_month']:.2f}/month"
          + f"\nwritten to {path}; rerun: {section['rerun']}")  # fmt: skip
    checks = section["checks"]
    return 0 if checks["every_fire_delivered"] and not checks["early"] else 1


if __name__ == "__main__":
    raise SystemExit(main())

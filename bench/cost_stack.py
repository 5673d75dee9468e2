"""The cost benchmark's deployment, in-process on one injected clock (see bench.cost).

What EventBridge, API Gateway, Lambda and the SQS event source would do, poll by poll: the
api handler for HTTP API events, the migrator every minute, the fan-out peeking every POLL_MS,
the trigger for every run it starts, and the delivery function for what lands on the delivery
queue (received, handed over as an SQS event and deleted as Lambda's poller does). Every
client the functions use is metered (``bench.meter``); the scaffolding (setup, the tenant's
consumer, the sparse mode's peeks) uses uncounted clients.

Sparse mode (``stack.sparse = True``): when Redis holds nothing due or leased within
SPARSE_NEAR_MS, the clock jumps to the next minute boundary or to 1 s before the earliest
due member, whichever is first - the migrator still runs every minute and the fan-out's run
is still counted every minute; only the idle polls between are skipped. What is subtracted
as idle is modelled per piece of work (:class:`IdleModel`): each minute's scheduled starts at
their idle cost, and each fan-out poll at the idle cost of a poll, measured poll by poll in a
dense and a sparse idle stretch. So a sparse window subtracts exactly the polls it made,
and the dense polling a real deployment does anyway is neither counted nor over-subtracted.

Lambda sandboxes are tracked per function (:class:`Sandboxes`): an invocation finds a warm
one if the function ran within SANDBOX_IDLE_MS, else it is a cold start (INIT, billed since
2025-08-01). X-Ray's default sampling (1 request a second, then 5 % of the rest) is applied
per second to the functions with active tracing that the benchmark invokes (api, migrator).
"""

from __future__ import annotations

import copy
import json
import math
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ops.offline import use_fake_aws

use_fake_aws()  # never reach a real account, whatever the shell has: moto only

import boto3  # noqa: E402
import redis  # noqa: E402

from bench.meter import (  # noqa: E402
    CountingConnection,
    DynamoHooks,
    Meter,
    SqsHooks,
    redis_commands,
    table_specs,
)
from functions.api import app as api_app  # noqa: E402
from functions.api.app import resolver as api_resolver  # noqa: E402
from functions.delivery import app as delivery_app  # noqa: E402
from functions.migrator import app as migrator_app  # noqa: E402
from functions.trigger import app as trigger_app  # noqa: E402
from ops import admin, template  # noqa: E402
from ops.local.context import LambdaContext  # noqa: E402
from ops.local.queues import sqs_event  # noqa: E402
from ops.local.spec import QueueSourceSpec  # noqa: E402
from tests.support.clock import FakeClock, injected_clock_fanout  # noqa: E402
from tests.support.serialized import one_call_at_a_time  # noqa: E402
from tests.support.webhook_server import WebhookServer  # noqa: E402
from timers.core.webhook_attempts import Attempt  # noqa: E402
from timers.delivery import http_target  # noqa: E402
from timers.delivery.decisions import DeliveryDeps  # noqa: E402
from timers.delivery.failed_fires import FailedFireStore  # noqa: E402
from timers.delivery.messages import Message, dead_letter_body, requeue_body  # noqa: E402
from timers.delivery.records import DeliveryRecords  # noqa: E402
from timers.delivery.target_slots import TargetSlots  # noqa: E402
from timers.engine import keys  # noqa: E402
from timers.engine.fanout import POLL_MS  # noqa: E402
from timers.engine.index import NOTED  # noqa: E402
from timers.runtime import build_runtime, migrator_deps, trigger_deps  # noqa: E402


def retention_check_in_constant_time() -> None:
    """moto checks each message it receives against the queue's retention period by building
    every attribute of the queue - three scans of all its messages - so draining a backlog of
    n messages cost n² (1,441 queued at 100 fires/s took minutes of a single drain). The same
    check read straight from the queue: the same answer, and nothing the stack counts moves."""
    from moto.sqs.models import SQSBackend

    def valid(backend: SQSBackend, queue_name: str, message: Any) -> bool:
        retention_s = int(backend.get_queue(queue_name).message_retention_period)  # type: ignore[attr-defined]
        return retention_s + message.sent_timestamp / 1000 > time.time()

    SQSBackend.is_message_valid_based_on_retention_period = valid  # type: ignore[method-assign,assignment]


def clock_sleep(meter: Meter, clock: FakeClock) -> Callable[[float], None]:
    """A sleep that moves the one clock (an armed run waits for its send instants), counted as
    the running handler's wait (``waited.<function>``): Lambda bills a handler as it waits."""

    def sleep(seconds: float) -> None:
        ms = max(1, math.ceil(seconds * 1000))
        if meter.scope:
            meter.add(f"waited.{meter.scope}", ms)
        clock.advance(ms)

    return sleep


ROOT = Path(__file__).resolve().parent.parent
T0 = 1_795_255_140_000  # 2026-11-21T09:59:00Z: a minute boundary
TENANT = "acme"
SPARSE_NEAR_MS = 2_000  # dense polling while anything is due (or leased) this soon
SANDBOX_IDLE_MS = 10 * 60_000
"""An idle Lambda sandbox is retired after about this long (not documented; 5-15 min seen)."""
DELIVERY_POLLERS = 5
"""Batches Lambda's SQS event source hands out at once to start with (its 5 pollers)."""
XRAY_RESERVOIR_PER_S, XRAY_RATE = 1, 0.05  # the default rule Lambda samples with


def traced() -> set[str]:
    """The functions Lambda traces actively as deployed with the default parameters (X-Ray
    bills each trace)."""
    default = template.load().get("Globals", {}).get("Function", {}).get("Tracing")
    fns = template.resources("AWS::Serverless::Function")
    names = {"api": "ApiFunction", "migrator": "MigratorFunction"}
    return {k for k, v in names.items()
            if template.as_deployed(fns[v].get("Tracing", default)) == "Active"}  # fmt: skip


def endpoint_azs() -> int:
    """Zones the interface endpoints have a network interface in, as deployed by default."""
    return int(template.as_deployed(template.Tag("Ref", "InterfaceEndpointAzs")))


PLATFORM_LINES_BYTES = 400  # START, END and REPORT of one invocation


def platform_log_bytes() -> int:
    """Bytes of Lambda's own lines per invocation as deployed by default: START, END and REPORT
    are INFO lines, so PlatformLogLevel WARN logs none."""
    level = template.as_deployed(template.Tag("Ref", "PlatformLogLevel"))
    return 0 if level == "WARN" else PLATFORM_LINES_BYTES


TRACED = traced()

IDLE_KEEP = ("fires", "trigger.runs", "minutes", "dense_ms")


class PrefixMeter(Meter):
    """Adds every count as itself and once more under each prefix (one function's share)."""

    def __init__(self, meter: Meter, *prefixes: str) -> None:
        self.meter, self.prefixes = meter, prefixes

    def add(self, key: str, amount: float = 1) -> None:
        self.meter.add(key, amount)
        for prefix in self.prefixes:
            self.meter.add(prefix + key, amount)


class Sandboxes:
    """Warm sandboxes of one function: ``start(now, k)`` runs k invocations at once and
    returns how many of them were cold starts."""

    def __init__(self, now: int) -> None:
        self.last_used = [now]  # the deployment starts warm: one sandbox each

    def start(self, now: int, k: int = 1) -> int:
        warm = sorted((t for t in self.last_used if now - t <= SANDBOX_IDLE_MS), reverse=True)
        cold = max(0, k - len(warm))
        self.last_used = [now] * k + warm[k:]
        return cold


@dataclass
class IdleModel:
    """What an idle deployment spends: per minute's scheduled starts, and per fan-out poll
    (every poll peeks at every bucket), measured poll by poll."""

    minute: dict[str, float] = field(default_factory=dict)
    poll: dict[str, float] = field(default_factory=dict)

    def expected(self, counts: Mapping[str, float]) -> dict[str, float]:
        out: dict[str, float] = defaultdict(float)
        for k, v in self.minute.items():
            out[k] += counts.get("minutes", 0) * v
        for k, v in self.poll.items():
            out[k] += counts.get("fanout.polls.-", 0) * v
        return dict(out)


@dataclass(frozen=True)
class Window:
    minutes: float
    counts: dict[str, float]

    def minus(self, idle: IdleModel) -> dict[str, float]:
        """What the scenario added over the idle work of the same minutes and polls."""
        expected = idle.expected(self.counts)
        return {k: v - (0 if k in IDLE_KEEP else expected.get(k, 0))
                for k, v in self.counts.items()
                if not k.startswith("fanout.polls.")}  # fmt: skip


@dataclass
class Stack:
    meter: Meter
    redis_url: str
    log_bytes: Callable[[], int]
    webhooks: WebhookServer
    clock: FakeClock = field(default_factory=lambda: FakeClock(T0))
    invoked: list[dict[str, Any]] = field(default_factory=list)
    received: Counter[str] = field(default_factory=Counter)
    early: int = 0
    runs: int = 0
    sparse: bool = False
    profile: IdleProfile | None = None  # set while an idle stretch is profiled
    idle_profile: IdleProfile = field(default_factory=lambda: IdleProfile())

    def __post_init__(self) -> None:
        retention_check_in_constant_time()  # moto's SQS for this stack's drains (idempotent)
        settings = template.local_settings()
        template.create_tables(boto3.client("dynamodb"))
        pool = redis.ConnectionPool.from_url(
            self.redis_url, connection_class=CountingConnection, decode_responses=True
        )
        conn = redis.Redis(connection_pool=pool)
        self.admin_redis = redis.Redis.from_url(self.redis_url, decode_responses=True)
        self.admin_redis.flushall()
        self.admin_commands = 0  # the sparse mode's peeks: not the deployment's work
        self.raw_sqs = boto3.client("sqs")  # uncounted: setup and the consumer's reads
        template.create_queues(self.raw_sqs)
        queue = self.raw_sqs.get_queue_url
        self.delivery_queue = queue(QueueName="DeliveryQueue")["QueueUrl"]
        redrive = queue(QueueName="DeliveryRedriveQueue")["QueueUrl"]
        settings = replace(settings, delivery_queue_url=self.delivery_queue,
                           delivery_redrive_queue_url=redrive,
                           delivery_dlq_url=queue(QueueName="DeliveryDeadLetterQueue")["QueueUrl"],
                           timers_allow_loopback_targets=True)  # fmt: skip
        self.settings = settings
        created = admin.create_tenant(admin.Target(settings, self.raw_sqs), TENANT)
        self.api_key, self.queue_url = created["api_key"], created["callback_queue_url"]
        self.runtime = build_runtime(settings, self.clock, redis_conn=conn, reference=self.clock)
        service = self.runtime.service
        service.allow_loopback_targets = True

        names = {lid: getattr(settings, f) for lid, f in template.TABLE_SETTINGS.items()}
        specs = table_specs(names)
        raw_dynamodb = boto3.client("dynamodb")
        dynamo = DynamoHooks(self.meter, raw_dynamodb, specs)
        timer_models, tenant_models = self.runtime.wiring.timers.models, self.runtime.tenants.models
        models = (timer_models.timer, timer_models.payload, service.idempotency.model,
                  tenant_models.tenant, tenant_models.api_key)  # fmt: skip
        for model in models:
            dynamo.register(model._get_connection().connection.client)
        wiring = self.runtime.wiring
        assert service.usage is not None and service.extras is not None
        for store in (wiring.log, wiring.wake, wiring.timers, service.usage):
            dynamo.register(store.client)  # the api's usage counters have a client of their own
        sqs = boto3.client("sqs")
        SqsHooks(self.meter).register(sqs)
        self.sqs = sqs
        service.extras.sqs = lambda: sqs  # run now sends from the api: metered alike
        self.index = wiring.index

        sleep = clock_sleep(self.meter, self.clock)
        self.trigger_deps = trigger_deps(wiring, sqs=sqs, clock=self.clock, reference=self.clock,
                                         monotonic=None, sleep=sleep)  # fmt: skip
        self.migrator_deps = migrator_deps(wiring, clock=self.clock)
        self.fanout = injected_clock_fanout(wiring, self._invoke, self.clock, sleep)
        self._delivery_setup(settings, raw_dynamodb, specs)
        # The real handlers with our clients and clock (they build their deps once per cold
        # start; these stand in for that build).
        api_resolver._runtime = self.runtime
        trigger_app.wired = lambda: (wiring, self.trigger_deps)  # type: ignore[assignment]
        migrator_app.deps = lambda: self.migrator_deps  # type: ignore[assignment]
        self._event = json.loads((ROOT / "events" / "api-create-timer.json").read_text())
        conn.ping()  # a warm Lambda's connection is already open
        self._minute = -1
        self.sandboxes: dict[str, Sandboxes] = defaultdict(lambda: Sandboxes(T0))
        self._traced: dict[str, tuple[int, int]] = {}  # function -> (second, requests in it)

    def _delivery_setup(self, settings: Any, raw_dynamodb: Any, specs: Any) -> None:
        """The delivery function's deps, as its cold start builds them, on metered clients."""
        meter = PrefixMeter(self.meter, "delivery.")
        lock = threading.Lock()
        clients = {}  # one client in the function; two here, to tell records from slots
        for part in ("records", "slots", "failures"):
            client = boto3.client("dynamodb")
            hooks = DynamoHooks(PrefixMeter(self.meter, "delivery.", f"delivery.{part}."),
                                raw_dynamodb, specs)  # fmt: skip
            hooks.register(client)
            clients[part] = one_call_at_a_time(client, lock)
        sqs = boto3.client("sqs")
        SqsHooks(meter).register(sqs)
        self.delivery_sqs = sqs

        def post(url: str, body: bytes, headers: Mapping[str, str]) -> Attempt:
            sent = len(body) + sum(len(k) + len(v) + 4 for k, v in headers.items())
            self.meter.add("delivery.post_bytes", sent + len(url) + 40)  # + request line, host
            self.meter.add("delivery.posts")
            return http_target.post(url, body, headers, allow_loopback=True)

        def dead_letter(message: Message, reason: str) -> None:
            sqs.send_message(QueueUrl=settings.delivery_dlq_url,
                             **dead_letter_body(message, reason))  # fmt: skip

        def requeue(message: Message, delay_s: int) -> None:
            sqs.send_message(QueueUrl=settings.delivery_queue_url,
                             **requeue_body(message, delay_s))  # fmt: skip

        self.delivery_deps = DeliveryDeps(
            records=DeliveryRecords(settings.claims_table, settings.fire_retention_days,
                                    clients["records"]),
            slots=TargetSlots(settings.claims_table, settings.webhook_target_concurrency,
                              settings.webhook_tenant_concurrency, clients["slots"]),
            secrets=delivery_app._SecretCache(self.runtime.tenants),
            post=post,
            dead_letter=dead_letter,
            requeue=requeue,
            failed_fires=FailedFireStore(settings.failed_fires_table,
                                         settings.fire_retention_days, clients["failures"]),
            clock=self.clock,
        )  # fmt: skip
        delivery_app.deps = lambda: self.delivery_deps  # type: ignore[assignment]
        delivery_app.settings = lambda: settings  # type: ignore[assignment]
        delivery_app.sqs = lambda: sqs  # type: ignore[assignment]
        self.delivery_source = QueueSourceSpec(
            "DeliveryFunction", "DeliveryFunction.Deliveries", settings.delivery_queue_url,
            "arn:aws:sqs:us-east-1:123456789012:DeliveryQueue", 10, 0, True, None,
        )  # fmt: skip

    def _invoke(self, FunctionName: str, InvocationType: str, Payload: bytes) -> None:
        self.invoked.append(json.loads(Payload))

    def _lambda(self, name: str, timeout_s: float, cold: int = 0) -> LambdaContext:
        self.meter.add(f"lambda.{name}")
        if cold:
            self.meter.add(f"lambda.cold.{name}", cold)
        return LambdaContext(function_name=name, timeout_s=timeout_s)

    def _handle(self, module: Any, event: Any, context: LambdaContext) -> Any:
        """Run one function's handler, its AWS calls and Redis round trips counted as its own
        (``calls.<function>.<service>``: the waits the cost model bills at AWS's latency). The
        functions share one powertools logger in this process; keys a handler appends (the
        api's tenant and correlation id) are removed after it, as a separate Lambda function's
        lines would never carry them."""
        keys = set(module.logger.get_current_keys())
        name, trips = context.function_name, CountingConnection.round_trips
        self.meter.scope = name
        try:
            return module.handler(event, context)
        finally:
            self.meter.scope = None
            self.meter.add(f"calls.{name}.redis", CountingConnection.round_trips - trips)
            module.logger.remove_keys(
                [k for k in module.logger.get_current_keys() if k not in keys]
            )

    def _trace(self, name: str) -> None:
        """X-Ray's default rule on an actively traced function (TRACED): the first request of
        each second, then 5 % of the others (counted as their expected share)."""
        if name not in TRACED:
            return
        second = self.clock() // 1000
        seen_second, n = self._traced.get(name, (-1, 0))
        n = n + 1 if seen_second == second else 1
        self._traced[name] = (second, n)
        self.meter.add(f"xray.traces.{name}", 1.0 if n <= XRAY_RESERVOIR_PER_S else XRAY_RATE)

    # ------------------------------------------------------------ time passing

    def run(self, seconds: float) -> None:
        """Let the deployment run: the minute's scheduled starts, the fan-out's polls, the
        trigger runs they start, the delivery function, the tenant's consumer each second."""
        end = self.clock() + int(seconds * 1000)
        read_at = self.clock()
        while self.clock() < end:
            if self.clock() // 60_000 != self._minute:
                self._minute = self.clock() // 60_000
                self._scheduled_starts()
            self._act()
            if self.clock() - read_at >= 1_000:
                read_at = self.clock()
                self._deliver()
                self._consume()
            self.clock.advance(self._step(end))
        self._deliver()
        self._consume()

    def _scheduled_starts(self) -> None:
        before = self._snap() if self.profile is not None else None
        self.meter.add("minutes")
        cold = self.sandboxes["migrator"].start(self.clock())
        self._trace("migrator")
        self._handle(migrator_app, {}, self._lambda("migrator", 55, cold))
        self.meter.add("lambda.fanout")  # one 70 s run a minute (the loop is ours)
        if self.profile is not None and before is not None:
            self.profile.add("minute", before, self._snap())

    def _act(self) -> None:
        before = self._snap() if self.profile is not None else None
        self.fanout.act()
        self.meter.add("fanout.polls.-")
        if self.profile is not None and before is not None:
            self.profile.add("", before, self._snap())
        restores = [e for e in self.invoked if "restore" in e]
        self.invoked = [e for e in self.invoked if "restore" not in e]
        for event in restores:  # a lost bucket: the migrator restores it at once
            cold = self.sandboxes["migrator"].start(self.clock())
            self._handle(migrator_app, event, self._lambda("migrator", 55, cold))
        if self.invoked:
            group, self.invoked = self.invoked, []
            cold = self.sandboxes["trigger"].start(self.clock(), len(group))
            for i, event in enumerate(group):
                done = self._handle(trigger_app, event, self._lambda("trigger", 30, int(i < cold)))
                if not done.get("leased"):  # started early (a cold lead): no armed wait
                    self.meter.add("lambda.trigger.empty")
                self.runs += 1
            self._deliver()

    def _step(self, end: int) -> int:
        """POLL_MS; in sparse mode, up to the next minute or 1 s before what is due next."""
        now = self.clock()
        if not self.sparse or self.invoked:
            self.meter.add("dense_ms", POLL_MS)
            return POLL_MS
        earliest = self._earliest()
        if earliest is not None and earliest - now <= SPARSE_NEAR_MS:
            self.meter.add("dense_ms", POLL_MS)
            return POLL_MS
        target = (now // 60_000 + 1) * 60_000
        if earliest is not None:
            target = min(target, earliest - 1_000)
        return max(POLL_MS, min(target, end) - now)

    def _earliest(self) -> int | None:
        """The earliest score of every bucket (uncounted peeks)."""
        pipe = self.admin_redis.pipeline(transaction=False)
        for bucket in range(self.index.bucket_count):
            pipe.zrangebyscore(keys.due(bucket), "-inf", f"({NOTED}", 0, 1, withscores=True)
        answers = pipe.execute()
        self.admin_commands += len(answers)
        scores = [int(s) for answer in answers for _, s in answer]
        return min(scores) if scores else None

    def _deliver(self) -> None:
        """Lambda's SQS event source on the delivery queue: receive batches of 10, invoke the
        handler with them (up to DELIVERY_POLLERS at once), delete what it did not fail."""
        attrs = self.raw_sqs.get_queue_attributes(
            QueueUrl=self.delivery_queue, AttributeNames=["ApproximateNumberOfMessages"]
        )["Attributes"]
        if int(attrs.get("ApproximateNumberOfMessages", 0)) == 0:
            return  # the pollers' empty long polls are an idle-month item
        batches = []
        while got := self.delivery_sqs.receive_message(
            QueueUrl=self.delivery_queue, MaxNumberOfMessages=10, AttributeNames=["All"],
            MessageAttributeNames=["All"],
        ).get("Messages", []):  # fmt: skip
            batches.append(got)
        cold = self.sandboxes["delivery"].start(self.clock(), min(len(batches), DELIVERY_POLLERS))
        for i, messages in enumerate(batches):
            event = sqs_event(messages, self.delivery_source, "us-east-1")
            context = self._lambda("delivery", 60, int(i < cold))
            reply = self._handle(delivery_app, event, context)
            failed = {f["itemIdentifier"] for f in reply.get("batchItemFailures", [])}
            done = [m for m in messages if m["MessageId"] not in failed]
            if done:
                self.delivery_sqs.delete_message_batch(
                    QueueUrl=self.delivery_queue,
                    Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]}
                             for i, m in enumerate(done)],
                )  # fmt: skip

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
        for r in self.webhooks.received[self._posts_seen :]:
            body = json.loads(r.body)
            self.received[body["fire_id"]] += 1
            self.early += body["fired_at"] < body["scheduled_at"]
        self._posts_seen = len(self.webhooks.received)

    _posts_seen = 0

    # ------------------------------------------------------------ requests

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
        self._trace("api")
        cold = self.sandboxes["api"].start(self.clock())
        # The stack counts work, not time: a request moto serves slowly on a busy machine must
        # not become the api's 503 (its deadline is its Timeout on the wall clock), which the
        # deployment would not answer. The trigger keeps its 30 s: its leases are paced by it.
        result = self._handle(api_app, event, self._lambda("api", 900, cold))
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
            self.runtime.service.delete(self.runtime.tenants.get_tenant(TENANT), timer_id)  # type: ignore[arg-type]

    def stored_bytes(self, ids: list[str]) -> float:
        """Mean size of these timers' items as DynamoDB bills storage (+100 bytes each)."""
        from bench.meter import item_size

        raw, table = boto3.client("dynamodb"), self.settings.timers_table
        sizes = []
        for timer_id in ids:
            key = {"tenant": {"S": TENANT}, "timer_id": {"S": timer_id}}
            item = raw.get_item(TableName=table, Key=key).get("Item")
            sizes.append(item_size(item) + 100 if item else 0)
        return sum(sizes) / max(1, len(sizes))

    # ------------------------------------------------------------ measuring

    def _snap(self) -> dict[str, float]:
        counts = self.meter.snapshot()
        counts["redis.round_trips"] = CountingConnection.round_trips
        counts["redis.commands"] = redis_commands(self.admin_redis) - self.admin_commands
        counts["log.bytes"] = self.log_bytes()
        return counts

    def snapshot(self) -> dict[str, float]:
        counts = self._snap()
        counts["fires"] = sum(self.received.values())
        counts["trigger.runs"] = self.runs
        return counts

    def measure(self, seconds: float, before: Callable[[], Any] | None = None) -> Window:
        start = self.snapshot()
        if before is not None:
            before()
        self.run(seconds)
        return self.window_since(start)

    def window_since(self, start: dict[str, float]) -> Window:
        end = self.snapshot()
        counts = {k: end.get(k, 0) - start.get(k, 0) for k in end}
        return Window(counts.get("minutes", 0), counts)

    def profile_idle(self, seconds: float) -> Window:
        """An idle stretch, profiled poll by poll into ``self.profile``."""
        self.profile = self.idle_profile
        try:
            return self.measure(seconds)
        finally:
            self.profile = None


class IdleProfile:
    """Idle work by kind: each minute's scheduled starts, each kind of fan-out poll."""

    def __init__(self) -> None:
        self.sums: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.n: Counter[str] = Counter()

    def add(self, kind: str, before: dict[str, float], after: dict[str, float]) -> None:
        self.n[kind] += 1
        for k in after:
            if k not in IDLE_KEEP and not k.startswith("fanout.polls.") and k != "minutes":
                self.sums[kind][k] += after[k] - before.get(k, 0)

    def model(self) -> IdleModel:
        mean = {kind: {k: v / self.n[kind] for k, v in s.items()} for kind, s in self.sums.items()}
        return IdleModel(minute=mean.pop("minute", {}), poll=mean.get("", {}))

"""The system under test of the stateful test: the real fire path on one injected clock.

Real redis-server, moto (in process) for DynamoDB, the real api handler, migrator, fan-out and
trigger cores wired as in Lambda. Around them, only observation and faults:

- a recording SQS sink (what was sent, by which run, at which reference time);
- a spy on the claim store's *fresh* claims (when each fire id was first claimed), which the
  model needs to tell "claimed before the change" from "after";
- one-shot faults on DynamoDB calls (any client: boto3's and pynamodb's both go through
  botocore's ``_make_api_call``): a kill (the process dies there), a timeout before the call
  reached DynamoDB, or one after DynamoDB applied it;
- Redis outages: the next N commands (of anyone) fail as a failover's dropped connections do;
  a failover to a replica that lagged (the buckets roll back to a snapshot); a shard's data
  lost (some buckets' keys gone);
- DynamoDB's limits in moto (``ops.aws_limits``), with a small item-size limit for claim
  items, as DynamoDB's 400 KB is for real ones.
"""

from __future__ import annotations

import itertools
import json
import os
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import boto3
import botocore.client
import pytest
import redis
from botocore.exceptions import ClientError, ReadTimeoutError
from moto import mock_aws

from ops import template
from ops.aws_limits import ITEM_BYTES, aws_limits
from ops.redis_cluster import LocalRedisCluster
from tests.integration.api_harness import SETTINGS, Api, make_api
from tests.stateful.model import Model, Sent
from tests.support.clock import T0, FakeClock, injected_clock_fanout
from tests.support.real_parts import RedisTarget, dynamodb_at
from timers.core import timer as timer_core
from timers.core.times import parse_ms
from timers.engine import keys
from timers.engine.entries import Entry
from timers.engine.fanout import LEAD_MS
from timers.engine.index import BucketIndex, Leased, Peek, member_of
from timers.engine.log import FireLog
from timers.engine.migrate import run_migrator
from timers.engine.trigger import Hook, RunMarker, TriggerDeps, TriggerReport, run_trigger
from timers.runtime import migrator_deps, trigger_deps

CLAIM_CAP = 8
"""Attributes per claim item in the test: small, so hot seconds seal items all the time."""
CLAIM_ITEM_BYTES = 1_200
"""The item limit for claim items in the test (DynamoDB's sizes): DynamoDB's 400 KB, scaled to
the cap (eight of the largest entries are ~950 bytes; an item that outgrows the cap fails, and
changes nothing, like a real one)."""


BUCKETS = 2
"""A small deployment: two buckets, so one-shots share wake items and buckets as a big
deployment's do under load, and losing one bucket leaves the other."""
MAX_JUMP_MS = 30_000
"""How far the clock may jump to give a run work (a longer jump is an outage, a rule of its
own; each jump makes a backlog of the every-second timers)."""
MARKER_REDIS_TTL_MS = 3_600_000  # run markers expire on the injected clock (expire_markers)


class Kill(BaseException):
    """The process dies here (Lambda timeout, OOM, host loss): nothing of it runs on. A
    BaseException, so no ``except Exception`` clean-up in the code under test sees it."""


class Runaway(BaseException):
    """A run that never ends (a chain that loops on itself): a failure, not a fault - past the
    service's ``except Exception``; a run's own becomes an AssertionError once out of it."""


TENANTS = ("acme", "globex")
RUNAWAY_STEPS = 5_000
"""Steps (hook calls) one run may take: a run drains at most a few hundred leases here."""
RUNAWAY_CALLS = int(os.environ.get("TIMERS_MACHINE_RUNAWAY_CALLS", "30000"))
"""DynamoDB calls one step of the machine may make (settles included): a walk that never ends
(a chain read round and round) fails the test as a Runaway instead of hanging it."""


class InjectedTimeout(ReadTimeoutError):
    def __init__(self) -> None:
        super().__init__(endpoint_url="https://dynamodb.injected")


FaultKind = Literal["kill", "timeout_before", "timeout_after", "throttle"]


@dataclass
class Fault:
    operation: str  # "UpdateItem", "TransactWriteItems", "BatchWriteItem", ... or "*"
    kind: FaultKind
    skip: int = 0  # let this many matching calls through first

    def matches(self, operation: str) -> bool:
        return self.operation in ("*", operation)


class InjectedRedisError(redis.ConnectionError):
    """A Redis command lost to an outage."""


CLUSTER_WEATHER = (redis.ConnectionError, redis.TimeoutError, redis.exceptions.ClusterError,
                   redis.exceptions.TryAgainError, redis.exceptions.MovedError,
                   redis.exceptions.AskError, redis.exceptions.MasterDownError)  # fmt: skip
"""What a Redis Cluster answers while it fails over or moves a slot: on the cluster tier these
are the world's faults (a CROSSSLOT or a script error is not)."""
cluster_faults = [False]  # set while the world runs on a Redis Cluster


def injected(exc: BaseException | None) -> bool:
    """Whether an exception (or what caused it) is one the test injected."""
    while exc is not None:
        if isinstance(exc, Kill | InjectedTimeout | InjectedRedisError):
            return True
        if cluster_faults[0] and isinstance(exc, CLUSTER_WEATHER):
            return True
        if isinstance(exc, ClientError) and "injected" in str(exc):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


class Faults:
    """Armed faults, each fired once, on DynamoDB calls of any client."""

    def __init__(self) -> None:
        self.armed: list[Fault] = []
        self.fired: list[Fault] = []
        self.spared = False  # the test's own calls (observing, expiring) go through
        self.calls = 0  # DynamoDB calls of the current step (RUNAWAY_CALLS)
        self.most = 0  # the most one step made so far
        self._lock = threading.Lock()

    def new_step(self) -> None:
        self.most, self.calls = max(self.most, self.calls), 0

    def take(self, operation: str) -> Fault | None:
        """The armed fault this DynamoDB call meets, if any; every call counts toward the
        step's RUNAWAY_CALLS (counted under the lock: the migrator calls from threads)."""
        with self._lock:
            self.calls += 1
            if self.calls > RUNAWAY_CALLS:
                raise Runaway(f"{self.calls} DynamoDB calls in one step: a loop never ends")
            if self.spared:
                return None
            for fault in self.armed:
                if fault.matches(operation):
                    if fault.skip:
                        fault.skip -= 1
                        return None
                    self.armed.remove(fault)
                    self.fired.append(fault)
                    return fault
        return None

    @contextmanager
    def installed(self) -> Iterator[None]:
        original = botocore.client.BaseClient._make_api_call
        faults = self

        def call(client: Any, operation: str, params: dict[str, Any]) -> Any:
            fault = None
            if client.meta.service_model.service_name == "dynamodb":
                fault = faults.take(operation)
            if fault is not None and fault.kind == "kill":
                raise Kill(operation)
            if fault is not None and fault.kind == "timeout_before":
                raise InjectedTimeout()
            if fault is not None and fault.kind == "throttle":
                error = {"Code": "ThrottlingException", "Message": "injected"}
                raise ClientError({"Error": error}, operation)
            result = original(client, operation, params)
            if fault is not None and fault.kind == "timeout_after":
                raise InjectedTimeout()
            return result

        botocore.client.BaseClient._make_api_call = call  # type: ignore[method-assign]
        try:
            yield
        finally:
            botocore.client.BaseClient._make_api_call = original  # type: ignore[method-assign]


class RedisOutage:
    """While ``failing`` is above zero, each Redis command or pipeline (of any client) fails
    and counts it down: a failover's dropped connections, which the code sees whatever its
    client's retries (a pipeline fails whole, as a dropped connection fails it)."""

    def __init__(self) -> None:
        self.failing = 0
        self.spared = False  # the test's own calls (looking, flushing) go through
        self._lock = threading.Lock()

    def _fail(self) -> None:
        with self._lock:
            if self.failing <= 0 or self.spared:
                return
            self.failing -= 1
        raise InjectedRedisError("injected: Redis is failing over")

    @contextmanager
    def installed(self) -> Iterator[None]:
        outage = self
        clients = (redis.Redis, redis.RedisCluster)
        pipelines = (redis.client.Pipeline, redis.cluster.ClusterPipeline)
        commands = [c.execute_command for c in clients]
        executes = [p.execute for p in pipelines]

        def failing(command: Callable[..., Any]) -> Callable[..., Any]:
            def failing_command(client: Any, *args: Any, **options: Any) -> Any:
                outage._fail()
                return command(client, *args, **options)

            return failing_command

        def failing_pipeline(execute: Callable[..., Any]) -> Callable[..., Any]:
            def failing_execute(pipe: Any, *args: Any, **kw: Any) -> Any:
                if pipe.command_stack:
                    outage._fail()
                return execute(pipe, *args, **kw)

            return failing_execute

        for cls, command in zip(clients, commands, strict=True):
            cls.execute_command = failing(command)  # type: ignore[method-assign]
        for pipeline, execute in zip(pipelines, executes, strict=True):
            pipeline.execute = failing_pipeline(execute)  # type: ignore[method-assign]
        try:
            yield
        finally:
            for cls, command in zip(clients, commands, strict=True):
                cls.execute_command = command  # type: ignore[method-assign]
            for pipeline, execute in zip(pipelines, executes, strict=True):
                pipeline.execute = execute  # type: ignore[method-assign]


def claim_item_limit(table: str, item: Mapping[str, Any]) -> int:
    """DynamoDB's item limit, scaled down to CLAIM_ITEM_BYTES for claim items."""
    return CLAIM_ITEM_BYTES if "/" in item.get("k", {}).get("S", "") else ITEM_BYTES


class SinkSqs:
    """Takes every batch (SQS itself is not under test: moto's slows with depth) and records
    each callback with the reference time it was sent at and the run that sent it."""

    def __init__(self, clock: FakeClock, sends: list[Sent]) -> None:
        self.clock, self.sends, self.run = clock, sends, 0
        self._lock = threading.Lock()

    def send_message_batch(self, *, QueueUrl: str, Entries: list[Any]) -> Any:
        with self._lock:
            for e in Entries:
                body = json.loads(e["MessageBody"])
                due = parse_ms(body["scheduled_at"])
                fire = (body["fire_id"], body["timer_id"], due, self.clock())
                self.sends.append(Sent(*fire, body["payload"], body["name"], self.run))
        return {"Successful": [{"Id": e["Id"]} for e in Entries], "Failed": []}


def spy_on_claims(
    claims: FireLog, clock: FakeClock, claimed: dict[str, int], last: list[str | None]
) -> None:
    """Record when each fire id was first claimed (a fresh claim: over nothing, or a fence),
    and in ``last`` the timer of the latest one."""
    lock = threading.Lock()
    claim, take_over, take_over_many = claims.claim, claims.take_over, claims.take_over_many

    def note(key: str, name: str, entry: Entry) -> None:
        if entry.state != "p":
            return
        timer_id, ms = name.split("@")
        due = int(key.split("/")[1]) * 1000 + int(ms)
        with lock:
            claimed.setdefault(f"{timer_id}:{entry.fired or due}", clock())
            last[0] = timer_id

    def applied(key: str, names: Any, entries: Any) -> None:
        """A write that failed may have been applied (a timeout after DynamoDB took it)."""
        for name in names:
            stored = claims.read_one((key, name))
            if stored is not None and stored == entries[name]:
                note(key, name, stored)

    def spied_claim(key: str, entries: Any, seen: Any = None) -> bool:
        try:
            ok = claim(key, entries, seen)
        except BaseException:
            applied(key, entries, entries)
            raise
        if ok:
            for name, entry in entries.items():
                note(key, name, entry)
        return ok

    def spied_take_over(key: str, name: str, entry: Entry, old: Entry) -> bool:
        try:
            ok = take_over(key, name, entry, old)
        except BaseException:
            if old.state == "t":
                applied(key, [name], {name: entry})
            raise
        if ok and old.state == "t":
            note(key, name, entry)
        return ok

    def spied_take_over_many(key: str, entries: Any) -> bool:
        try:
            ok = take_over_many(key, entries)
        except BaseException:
            fresh = {n: e for n, (e, old) in entries.items() if old.state == "t"}
            applied(key, fresh, fresh)
            raise
        if ok:
            for name, (entry, old) in entries.items():
                if old.state == "t":
                    note(key, name, entry)
        return ok

    claims.claim = spied_claim  # type: ignore[method-assign]
    claims.take_over = spied_take_over  # type: ignore[method-assign]
    claims.take_over_many = spied_take_over_many  # type: ignore[method-assign]


LEASE_LIMIT = 10
"""Cards a lease takes in the test: small, so a crowd of a few dozen (a look of 40) already
hides what lies behind it, as hundreds do in a deployment."""


def spy_on_leases(index: BucketIndex, observing: Callable[[], Any], unfair: list[str]) -> None:
    """Check every lease for fairness: while no more tenants have work than a lease takes,
    each tenant with a leasable member (a card, due by the lease's time, or queued) gets at
    least one in any lease that takes something - however many another tenant has, whatever
    the tenants are called."""
    lease = index.lease
    redis_client = index.client

    def leasable(bucket: int, until: int) -> dict[str, int]:
        with observing():
            names = [_text(m) for m in redis_client.zrangebyscore(keys.due(bucket), "-inf", until)]
            cards = redis_client.hmget(keys.data(bucket), names) if names else []
        return dict(Counter(m.split("|")[0] for m, c in zip(names, cards, strict=True) if c))

    def fair_lease(bucket: int, until: int, lease_end: int, limit: int, *args: Any) -> Leased:
        before = leasable(bucket, until)
        got = lease(bucket, until, lease_end, limit, *args)
        missed = set(before) - {c.timer.tenant for c in got.cards}
        if got.cards and len(before) <= limit and missed:
            unfair.append(f"bucket {bucket}: a lease of {len(got.cards)} at {until} took none "
                          f"of {sorted(missed)} (leasable before it: {before})")  # fmt: skip
        return got

    index.lease = fair_lease  # type: ignore[method-assign]


def bucket_keys(bucket: int) -> tuple[str, ...]:
    """A bucket's keys (all but its run markers): what a shard that lost its data lacks."""
    return keys.due(bucket), keys.data(bucket), keys.tags(bucket), keys.tails(bucket)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass
class RunOutcome:
    report: TriggerReport | None
    error: BaseException | None
    sent: set[str] = field(default_factory=set)


class World:
    """One fresh service per example (moto, Redis, tables, tenants), driven step by step."""

    def __init__(
        self, redis_at: RedisTarget, dynamodb: str | None = None,
        cluster: LocalRedisCluster | None = None,
    ) -> None:  # fmt: skip
        """On a redis-server and moto; or a Redis Cluster (``cluster``: the faults that hurt
        it) and DynamoDB Local (``dynamodb``: its endpoint)."""
        self._stack = ExitStack()
        self.cluster = cluster
        cluster_faults[0] = cluster is not None
        self.clock = FakeClock()
        self.model = Model()
        self.model.held_for = self.held_for
        self.faults = Faults()
        self.outage = RedisOutage()
        self.host_offset_ms = 0
        self.invoked: list[dict[str, Any]] = []
        self.runs = 0
        self.next_migration = self.clock() // 60_000 * 60_000 + 60_000  # EventBridge's minutes
        stack = self._stack
        stack.enter_context(mock_aws())
        monkeypatch = stack.enter_context(pytest.MonkeyPatch.context())
        if dynamodb is None:
            stack.enter_context(aws_limits(claim_item_limit))
            template.create_tables(boto3.client("dynamodb"))
        else:  # its own limits; claim items are small by CLAIM_CAP alone
            stack.enter_context(dynamodb_at(dynamodb, monkeypatch))
        ids = itertools.count()  # timer ids (so partitions and buckets) the same on a replay
        monkeypatch.setattr(timer_core, "new_timer_id", lambda: f"tmr_{next(ids):024d}")
        self.api: Api = make_api(monkeypatch, self.clock, redis_at, bucket_count=BUCKETS)
        self.api.tenants.set_spread("acme", 1)  # one partition: hot seconds in one claim item
        groups = self.api.runtime.groups
        groups.change_limit, groups.workers = 2, 1  # a group goes in steps; one change at a time
        for name in TENANTS:  # the test reads a lot in one millisecond
            self.api.tenants.set_rate_limit(name, 1_000_000)
        stack.enter_context(self.faults.installed())
        stack.enter_context(self.outage.installed())
        self.wiring = self.api.runtime.wiring
        self.claims: FireLog = self.wiring.log
        self.claims.cap = CLAIM_CAP
        self._last_claimed: list[str | None] = [None]
        spy_on_claims(self.claims, self.clock, self.model.claimed, self._last_claimed)
        self.redis: Any = self.api.runtime.redis
        self.index = self.wiring.index
        spy_on_leases(self.index, self.observing, self.model.unfair)
        self.markers: dict[str, int] = {}  # run marker key -> when it expires, on our clock
        self._expire_markers_on_our_clock()
        self.sink = SinkSqs(self.clock, self.model.sends)
        extras = self.api.runtime.service.extras
        assert extras is not None
        extras.sqs = lambda: self.sink  # run now sends as the trigger does: recorded alike
        self.migrator = migrator_deps(self.wiring, sleep=lambda _: None)  # retries at once
        self.fanout = injected_clock_fanout(self.wiring, self._invoke, self.clock, self._sleep)
        self.snapshot: dict[str, bytes] = {}  # what a lagging replica holds
        self.cluster_faults: list[str] = []  # what the cluster rules did (TIMERS_MACHINE_SHOW)

    def close(self) -> None:
        try:
            if self.cluster is not None:  # the next example starts on the cluster as it began
                with self.observing():
                    self.cluster.fail_back()
        finally:
            cluster_faults[0] = False
            self._stack.close()

    @contextmanager
    def observing(self) -> Iterator[None]:
        """The test's own calls - looking at Redis, reading back a timer, expiring items -
        are spared the faults armed for the service."""
        self.faults.spared = self.outage.spared = True
        try:
            yield
        finally:
            self.faults.spared = self.outage.spared = False

    # ------------------------------------------------------------ the functions

    def _sleep(self, seconds: float) -> None:
        self.clock.advance(max(1, round(seconds * 1000)))

    def _invoke(self, FunctionName: str, InvocationType: str, Payload: bytes) -> None:
        self.invoked.append(json.loads(Payload))

    def trigger_deps(self, hooks: Callable[[Hook], None] | None) -> TriggerDeps:
        return trigger_deps(
            self.wiring,
            sqs=self.sink,
            clock=lambda: self.clock() + self.host_offset_ms,
            monotonic=lambda: self.clock() - T0 + 777,
            reference=self.clock,
            sleep=self._sleep,
            hooks=hooks,
            lease_limit=LEASE_LIMIT,
            # counts are written on a thread of their own, which would take the faults armed
            # for the run in an order no replay repeats; the model checks no usage
            usage=None,
        )

    def trigger(
        self,
        bucket: int,
        remaining_ms: int = 30_000,
        hooks: Callable[[Hook], None] | None = None,
        marker: RunMarker | None = None,
    ) -> RunOutcome:
        """One trigger run; a death it was made to die (or an injected fault that ended it)
        is its outcome, any other exception a failure of the code under test."""
        self.runs += 1
        self.sink.run = self.runs
        report, error = None, None
        steps = itertools.count()

        def counted(step: Hook) -> None:
            if next(steps) > RUNAWAY_STEPS:
                raise Runaway(f"a trigger run of bucket {bucket} never ends")
            if hooks is not None:
                hooks(step)

        try:
            report = run_trigger(self.trigger_deps(counted), bucket, remaining_ms, marker)
        except Runaway as exc:  # out of the run, a failure Hypothesis shrinks and prints
            raise AssertionError(str(exc)) from exc
        except BaseException as exc:
            if not injected(exc):
                raise
            error = exc
        sent = {s.fire_id for s in self.model.sends if s.run == self.runs}
        if error is not None or (report is not None and report.unrecorded):
            self.model.dup_ok |= sent  # died (or could not record) after its send: the window
        return RunOutcome(report, error, sent)

    def peeks(self) -> dict[int, Peek]:
        """Every bucket as the fan-out sees it (the test's own look: no faults)."""
        with self.observing():
            got = self.index.peek(range(self.index.bucket_count), self.clock() + LEAD_MS)
        return {b: p for b, p in got.items() if isinstance(p, Peek)}

    def due_buckets(self) -> list[int]:
        return sorted(b for b, peek in self.peeks().items() if peek.backlog)

    def next_head(self) -> int | None:
        return min((p.head for p in self.peeks().values() if p.head is not None), default=None)

    def buckets_with_work(self) -> list[int]:
        """The buckets with due work; if none has any, the clock first jumps to where the next
        card comes due if that is close (nothing runs in between), so that a run has
        something to claim."""
        if not (buckets := self.due_buckets()):
            head = self.next_head()
            if head is not None and head - self.clock() <= MAX_JUMP_MS:
                self.clock.now = max(self.clock(), head - LEAD_MS)
                buckets = self.due_buckets()
        return buckets

    def migrate(self, buckets: list[int] | None = None) -> BaseException | None:
        """A migrator run (every bucket, or a restore of those the fan-out found lost); an
        injected fault in one bucket is retried or left by the migrator itself."""
        try:
            run_migrator(self.migrator, self.clock(), buckets)
        except BaseException as exc:
            if not injected(exc):
                raise
            return exc
        return None

    def poll(self) -> None:
        try:
            self.fanout.act()
        except BaseException as exc:  # this poll is lost; the fan-out's next one goes on
            if not injected(exc):
                raise

    def run_invoked(self, remaining_ms: int = 30_000) -> None:
        # The fan-out invokes from a thread pool; runs go in one order, so a replay replays.
        # A restore of lost buckets (the migrator) goes first, as its invoke came first.
        self.invoked.sort(key=lambda e: ("restore" not in e, e.get("bucket"), e.get("slot")))
        while self.invoked:
            event = self.invoked.pop(0)
            if "restore" in event:
                self.migrate(event["restore"])
                continue
            self.trigger(
                event["bucket"], remaining_ms, marker=RunMarker(event["slot"], event["token"])
            )

    def history(self, timer_id: str, tenant: str) -> dict[str, str]:
        """The timer's fire history (all pages): each fire id and its status."""
        fires: dict[str, str] = {}
        cursor: str | None = None
        while True:
            query = {"limit": "100", **({"cursor": cursor} if cursor else {})}
            got = self.api.call("GET", f"/v1/timers/{timer_id}/fires", tenant=tenant, query=query)
            assert got.status == 200, got.body
            for fire in got.body["items"]:
                assert fire["fire_id"] not in fires, f"listed twice: {fire}"
                fires[fire["fire_id"]] = fire["status"]
            cursor = got.body["next_cursor"]
            if cursor is None:
                return fires

    def held_for(self, timer_id: str) -> str:
        """What the service holds for a timer - its view, its wake listings, its card and score
        and each bucket's sentinel, its claims: printed with a lost fire, as a failure on the
        real parts may not replay (their timing is real)."""
        with self.observing():
            views = {t: self.api.call("GET", f"/v1/timers/{timer_id}", tenant=t) for t in TENANTS}
            tenant, view = next(((t, r.body) for t, r in views.items() if r.status == 200),
                                (TENANTS[0], None))  # fmt: skip
            member = member_of(tenant, timer_id)
            pages = boto3.client("dynamodb").get_paginator("scan")
            listings = [item for page in pages.paginate(TableName=SETTINGS.wakeups_table)
                        for item in page["Items"] if timer_id in json.dumps(item)]  # fmt: skip
            buckets = {
                b: (self.redis.zscore(keys.due(b), member), self.redis.hget(keys.data(b), member),
                    self.redis.hget(keys.data(b), keys.SENTINEL))
                for b in range(self.index.bucket_count)
            }  # fmt: skip
        claims = [(f, at) for f, at in self.model.claimed.items() if f.startswith(f"{timer_id}:")]
        claimed = f"{len(claims)}, the last: {dict(claims[-10:])}"
        return (
            f"view: {view}\nwake listings: {listings}\nby bucket (due score, card, "
            f"sentinel): {buckets}\nclaimed: {claimed}\ncluster faults: {self.cluster_faults}"
        )

    def expire_ttl(self) -> None:
        """What DynamoDB's TTL deletes once items expired (it may take days; here at once)."""
        with self.observing():
            self._expire_ttl(self.clock() // 1000)

    def _expire_ttl(self, now_s: int) -> None:
        client = boto3.client("dynamodb")
        for table in ("ClaimsTable", "TimersTable", "WakeupsTable"):
            keys = [
                a["AttributeName"]
                for a in client.describe_table(TableName=table)["Table"]["KeySchema"]
            ]
            for page in client.get_paginator("scan").paginate(TableName=table):
                for item in page["Items"]:
                    expires = item.get("expires_at")
                    if expires is not None and int(expires["N"]) <= now_s:
                        client.delete_item(TableName=table, Key={k: item[k] for k in keys})

    def _expire_markers_on_our_clock(self) -> None:
        """Redis expires keys on its own clock, which does not jump with ours: a dead run's
        marker (set to outlive its deadline) would block its bucket for good, and one set for a
        few seconds could vanish in the middle of a step. Markers expire here on the injected
        clock instead, as they do in real time in a deployment."""
        index, markers, clock = self.index, self.markers, self.clock

        def on_our_clock(mark: Callable[[int, int, str, int, int | None], bool]) -> Any:
            def marked(
                bucket: int, slot: int, token: str, ttl_ms: int, promise: int | None = None
            ) -> bool:
                ok = mark(bucket, slot, token, MARKER_REDIS_TTL_MS, promise)
                if ok:
                    markers[keys.run(bucket, slot)] = clock() + ttl_ms
                return ok

            return marked

        index.start_run = on_our_clock(index.start_run)  # type: ignore[method-assign]
        index.touch_run = on_our_clock(index.touch_run)  # type: ignore[method-assign]

    def expire_markers(self) -> None:
        for key, until in list(self.markers.items()):
            if until <= self.clock():
                with self.observing():
                    self.redis.delete(key)
                del self.markers[key]

    @contextmanager
    def migrator_inside_the_next_create(self) -> Iterator[None]:
        """The next create writes its wake listing, then a migrator run happens, then it
        writes its timer."""
        timers = self.wiring.timers
        create = timers.create

        def late(created: Any) -> None:
            timers.create = create  # type: ignore[method-assign]
            self.migrate()
            create(created)

        timers.create = late  # type: ignore[method-assign]
        try:
            yield
        finally:
            timers.create = create  # type: ignore[method-assign]

    def flushall(self) -> None:
        """A failover to an empty replica."""
        with self.observing():
            if self.cluster is not None:  # on each master (a client's view may be a failover old)
                self.cluster.flush_all()
            else:
                self.redis.flushall()

    # ------------------------------------------------------------ a Redis Cluster's faults

    def kill_a_master(self, which: int) -> None:
        """A master dies: the fan-out's peeks fail for its buckets while its replica takes over
        (writes it had not replicated are lost), then the node comes back as a replica."""
        if self.cluster is None:
            return
        with self.observing():  # the harness's own calls: spared an outage armed for the service
            port = self.cluster.masters()[which % len(self.cluster.masters())]
            self.cluster_faults.append(f"killed master {port}")
            self.cluster.kill(port)
        self.poll()
        with self.observing():
            self.cluster.wait_settled()
            self.cluster.replace(port)

    def move_a_bucket(self, bucket: int, runs_meanwhile: bool) -> None:
        """A reshard moves a bucket's slot to another master; with ``runs_meanwhile`` the
        service runs while the slot is half moved (ASK, TRYAGAIN)."""
        if self.cluster is None:
            return
        with self.observing():
            slot = self.cluster.slot_of(keys.due(bucket))
            owner = self.cluster.owner(slot)
            target = next(p for p in self.cluster.masters() if p != owner)
            self.cluster_faults.append(f"moved bucket {bucket} to {target}")
            migration = self.cluster.begin_migration(slot, target)
        try:
            if runs_meanwhile:
                with self.observing():
                    migration.move_keys(1)
                self.run(1_000)
        finally:
            with self.observing():
                migration.finish()

    def lose_a_shard_for_real(self, which: int) -> None:
        """A shard's master and replica come back empty (a flush of one shard otherwise)."""
        if self.cluster is None:
            self.lose_bucket(which % self.index.bucket_count)
            return
        with self.observing():
            port = self.cluster.masters()[which % len(self.cluster.masters())]
            self.cluster_faults.append(f"lost shard {port}")
            self.cluster.lose_shard(port)

    def lose_bucket(self, bucket: int) -> None:
        """A shard's data lost (it came back empty): that bucket's keys are gone, no other."""
        with self.observing():
            self.redis.delete(*bucket_keys(bucket))

    def take_snapshot(self) -> None:
        """What a replica holds now: it lags the master from here on."""
        with self.observing():
            self.snapshot = {
                key: dumped
                for b in range(self.index.bucket_count)
                for key in bucket_keys(b)
                if (dumped := self.redis.dump(key)) is not None
            }

    def fail_over_to_the_snapshot(self) -> None:
        """A failover to the lagging replica: the buckets roll back to the snapshot (every
        write since is lost), and the fan-out's next peek fails as the master goes away."""
        with self.observing():
            for b in range(self.index.bucket_count):
                self.redis.delete(*bucket_keys(b))
            for key, dumped in self.snapshot.items():
                self.redis.restore(key, 0, dumped)
        self.outage.failing = 1
        self.poll()

    @property
    def last_claimed(self) -> str | None:
        """The timer of the latest fresh claim."""
        return self._last_claimed[0]

    # ------------------------------------------------------------ running

    def run(self, duration_ms: int, remaining_ms: int = 30_000) -> None:
        """The service as deployed, for ``duration_ms``: the migrator on EventBridge's minutes,
        the fan-out's polls, every run it starts run to its end. The clock jumps to what is next
        (a hint coming due, the next minute, the one-second sweep)."""
        end = self.clock() + duration_ms
        while self.clock() < end:
            if self.clock() >= self.next_migration:
                self.migrate()
                self.next_migration = self.clock() // 60_000 * 60_000 + 60_000
            self.expire_markers()
            self.poll()
            self.run_invoked(remaining_ms)
            upcoming = self.next_head()
            wake = min(self.next_migration, self.clock() + 1_000, end)
            if upcoming is not None:
                wake = min(wake, upcoming - LEAD_MS)
            self.clock.now = max(self.clock() + 100, wake)

    def settle(self, duration_ms: int) -> tuple[int, int]:
        """Faults off, clocks right: the service runs on its own for ``duration_ms``, starting
        with a migrator run (a settle must not wait for the minute to find lost work)."""
        self.faults.armed.clear()
        self.outage.failing = 0
        self.host_offset_ms = 0
        start = self.clock()
        assert self.migrate() is None
        self.run(duration_ms)
        return start, self.clock()

"""Drive the real api handler with HTTP API events (payload format 2.0) against moto and a real
Redis."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import boto3
import pytest

from functions.api import app as api_app
from functions.api.app import resolver as api_resolver
from ops.local.apigw import from_proxy_result
from ops.local.context import LambdaContext
from ops.template import local_settings
from tests.support import apigw
from tests.support.clock import FakeClock
from tests.support.real_parts import RedisTarget
from timers.core.failures import FailedFire
from timers.core.webhook_attempts import DeliveryState
from timers.delivery.failed_fires import DeliveryQueue
from timers.engine.entries import Entry, entry_ref
from timers.runtime import Runtime, build_runtime
from timers.tenancy.tenants import TenantStore

SETTINGS = local_settings()


@dataclass
class Reply:
    status: int
    body: Any
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def error_code(self) -> str | None:
        return (
            self.body["error"]["code"]
            if isinstance(self.body, dict) and "error" in self.body
            else None
        )

    @property
    def error_fields(self) -> set[str]:
        return {d["field"] for d in self.body["error"]["details"]}


@dataclass
class Api:
    runtime: Runtime
    clock: FakeClock
    keys: dict[str, str]
    queues: dict[str, str]

    @property
    def tenants(self) -> TenantStore:
        return self.runtime.tenants

    def call(
        self,
        method: str,
        path: str,
        *,
        tenant: str | None = "acme",
        key: str | None = None,
        body: Any = None,
        raw_body: str | bytes | None = None,
        headers: dict[str, str] | None = None,
        query: dict[str, str] | str | None = None,
        content_type: str | None = "application/json",
    ) -> Reply:
        hdrs = dict(headers or {})
        api_key = key if key is not None else (self.keys[tenant] if tenant else None)
        if api_key is not None:
            hdrs["x-api-key"] = api_key
        event = apigw.event(
            method,
            path,
            body=body,
            raw_body=raw_body,
            headers=hdrs,
            query=query,
            content_type=content_type,
        )
        return self.send(event)

    def send(self, event: dict[str, Any]) -> Reply:
        """The handler's result for ``event``, read as API Gateway reads a 2.0 result."""
        result = api_app.handler(event, LambdaContext(function_name="api"))
        response = from_proxy_result(json.dumps(result).encode())
        assert response is not None, f"API Gateway would answer 500 to {result}"
        headers = {name.lower(): value for name, value in response.headers}
        if not response.body:
            return Reply(response.status, None, headers)
        try:
            body = json.loads(response.body)
        except ValueError:  # a page of the docs or the console
            body = response.body.decode()
        return Reply(response.status, body, headers)

    def create(self, tenant: str = "acme", **timer: Any) -> dict[str, Any]:
        reply = self.call("POST", "/v1/timers", tenant=tenant, body=timer)
        assert reply.status == 201, reply.body
        return dict(reply.body)


def make_api(
    monkeypatch: pytest.MonkeyPatch, clock: FakeClock, redis_at: str | RedisTarget, **settings: Any
) -> Api:
    """The api handler on a flushed Redis (a redis-server's URL, or a target: a Redis Cluster
    in cluster mode); ``settings`` override the local stack's."""
    target = redis_at if isinstance(redis_at, RedisTarget) else RedisTarget(redis_at, cluster=False)
    conn = target.client()
    conn.flushall()
    runtime = build_runtime(
        target.settings(**settings), clock, redis_conn=conn, sleep=clock.sleep, reference=clock
    )
    monkeypatch.setattr(api_resolver, "_runtime", runtime)
    sqs = boto3.client("sqs")
    keys, queues = {}, {}
    for name in ("acme", "globex"):
        queues[name] = sqs.create_queue(QueueName=f"timers-tenant-{name}")["QueueUrl"]
        runtime.tenants.put_tenant(name, queues[name], clock())
        keys[name] = runtime.tenants.add_key(name, clock())
    return Api(runtime, clock, keys, queues)


def seed_failed_fire(
    api: Api, timer_id: str, fire_id: str, failed: DeliveryState | None = None
) -> None:
    """What the trigger and the delivery function leave of an HTTP fire that failed: its claim
    entry (sent to the delivery queue), its delivery record (``failed``, by default one 400)
    and its failure, with the message; and the delivery queue a redelivery sends it to."""
    sqs = boto3.client("sqs")
    queue = sqs.create_queue(QueueName="DeliveryQueue")["QueueUrl"]
    api.runtime.failures.delivery_queue = DeliveryQueue(queue, sqs)
    timer = api.runtime.service.timers.get("acme", timer_id)
    assert timer is not None
    due = int(fire_id.rpartition(":")[2])
    ref = entry_ref(timer.partition, timer_id, due)
    claims = api.runtime.wiring.log
    sent = Entry(state="d", rev=timer.rev, n=1, enqueued=due, hook=True)
    assert claims.claim(ref[0], {ref[1]: sent})
    failed = failed or DeliveryState(1, due, due, 400, failed="http 400", failed_ms=due + 5)
    assert failed.failed is not None and failed.failed_ms is not None
    assert api.runtime.service.deliveries.write_delivery(ref, failed, None)
    api.runtime.failures.failures.put(
        FailedFire(
            tenant="acme", fire_id=fire_id, timer_id=timer_id, reason=failed.failed,
            last_status=failed.last_status, attempts=failed.attempts, failed_ms=failed.failed_ms,
            body=json.dumps({"fire_id": fire_id}),
            attributes={"fire_id": fire_id, "tenant": "acme", "claim": " ".join(ref),
                        "target": '{"url": "https://example.com/h", "headers": {}}'},
        )
    )  # fmt: skip

"""Each store binds its pynamodb models to its own table: two stores on two tables in one
process each read and write their own, whichever was built last (moto)."""

from __future__ import annotations

import json
from typing import Any

import boto3
import pytest

from ops import template
from tests.support.clock import T0
from timers.api.idempotency import IdempotencyStore
from timers.core.schedule import EverySchedule
from timers.core.timer import Timer
from timers.store.timers_table import INLINE_PAYLOAD_BYTES, TimerItem, TimerStore
from timers.tenancy.tenants import TenantStore

pytestmark = pytest.mark.integration

QUEUE = "https://sqs.us-east-1.amazonaws.com/123456789012/timers-tenant-acme"


@pytest.fixture
def dynamodb(aws: None) -> Any:
    """The template's tables twice: under their logical ids, and again with a "2" after them."""
    client = boto3.client("dynamodb")
    tables = template.resources("AWS::DynamoDB::Table")
    template.create_tables(client, {logical_id: f"{logical_id}2" for logical_id in tables})
    return client


def _keys(client: Any, table: str) -> set[tuple[str, str]]:
    """Every timers table item's key, read past pynamodb."""
    items = client.scan(TableName=table, ConsistentRead=True)["Items"]
    return {(i["tenant"]["S"], i["timer_id"]["S"]) for i in items}


def _timer(payload: str) -> Timer:
    return Timer(
        tenant="acme",
        id="tmr_same",
        schedule=EverySchedule(60),
        anchor_ms=T0,
        target_queue_url=QUEUE,
        payload_json=json.dumps(payload),
        next_fire_ms=T0 + 60_000,
        rev=1,
    )


def test_two_timer_stores_keep_to_their_own_tables(dynamodb: Any) -> None:
    first = TimerStore("TimersTable", clock=lambda: T0)
    second = TimerStore("TimersTable2", clock=lambda: T0)  # built last: it must not move the first
    big = "x" * INLINE_PAYLOAD_BYTES  # in its own payload item
    first.create_one(_timer("first"))
    second.create_one(_timer(big))

    one, two = first.get("acme", "tmr_same"), second.get("acme", "tmr_same")
    assert one is not None and two is not None
    assert (one.payload_json, two.payload_json) == (json.dumps("first"), json.dumps(big))
    assert _keys(dynamodb, "TimersTable") == {("acme", "tmr_same")}
    assert _keys(dynamodb, "TimersTable2") == {("acme", "tmr_same"), ("acme", "tmr_same#payload")}

    # Updates and the payload's transaction go through each store's own connection too.
    assert first.checkpoint(one, T0 + 120_000, 1, 0)
    assert second.complete(two, 1, 0, T0 + 86_400_000)
    one, two = first.get("acme", "tmr_same"), second.get("acme", "tmr_same")
    assert one is not None and two is not None
    assert (one.status, one.next_fire_ms, one.fire_count) == ("active", T0 + 120_000, 1)
    assert (two.status, two.next_fire_ms, two.expires_ms) == ("completed", None, T0 + 86_400_000)
    connections = {s.models.timer._get_connection().table_name for s in (first, second)}
    assert connections == {"TimersTable", "TimersTable2"}


def test_the_schema_alone_reaches_no_table(dynamodb: Any) -> None:
    TimerStore("TimersTable").create_one(_timer("first"))
    with pytest.raises(AttributeError, match="Meta"):
        TimerItem.get("acme", "tmr_same")


def test_two_tenant_stores_keep_to_their_own_tables(dynamodb: Any) -> None:
    first, second = TenantStore("TenantsTable"), TenantStore("TenantsTable2")
    first.put_tenant("acme", QUEUE, T0)
    second.put_tenant("acme", QUEUE + "-2", T0)
    key = first.add_key("acme", T0)

    assert first.authenticate(key) == first.get_tenant("acme")
    assert second.authenticate(key) is None  # the key is in the first table only
    one, two = first.get_tenant("acme"), second.get_tenant("acme")
    assert one is not None and two is not None
    assert (one.callback_queue_url, two.callback_queue_url) == (QUEUE, QUEUE + "-2")
    assert first.revoke_key(key) and not second.revoke_key(key)
    assert (first.revocation_count(), second.revocation_count()) == (1, 0)


def test_two_idempotency_stores_keep_to_their_own_tables(dynamodb: Any) -> None:
    first, second = IdempotencyStore("IdempotencyTable"), IdempotencyStore("IdempotencyTable2")
    assert first.claim("acme", "k", "hash-1", ["tmr_1"], T0) is None
    assert second.claim("acme", "k", "hash-2", ["tmr_2"], T0) is None  # new in its table
    first.complete("acme", "k")
    one, two = first.read("acme", "k", T0), second.read("acme", "k", T0)
    assert one is not None and two is not None
    assert (one.body_hash, one.done) == ("hash-1", True)
    assert (two.body_hash, two.done) == ("hash-2", False)

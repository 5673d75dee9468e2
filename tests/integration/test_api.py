"""Every route and rule of the HTTP contract, through the real handler (moto + real Redis)."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from ops.local.apigw import proxy_event
from tests.integration.api_harness import Api, Reply, make_api, seed_failed_fire
from tests.support import apigw
from tests.support.chains import fire
from tests.support.clock import T0, FakeClock
from tests.support.real_parts import RedisTarget
from timers.core.times import format_ms
from timers.core.webhooks import LOOPBACK_REFUSED, RetryPolicy
from timers.tenancy.auth import AUTH_CACHE_MS

EVENTS = Path(__file__).resolve().parents[2] / "events"
AT = format_ms(T0 + 3_600_000)  # an hour from the test clock's now


@pytest.fixture
def api(
    aws: None, clock: FakeClock, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Api]:
    yield make_api(monkeypatch, clock, redis_url)


def indexed(api: Api) -> set[tuple[str, int, int]]:
    """(timer id, position, revision) of every card in Redis, due or leased."""
    index = api.runtime.wiring.index
    return {
        (card.timer.id, card.pos, card.timer.rev)
        for bucket in range(index.bucket_count)
        for _, card in index.cards(bucket).values()
    }


def stored(api: Api, timer_id: str, tenant: str = "acme") -> Any:
    timer = api.runtime.service.timers.get(tenant, timer_id)
    assert timer is not None
    return timer


def timer_count(api: Api, tenant: str = "acme") -> int:
    return len(api.call("GET", "/v1/timers", tenant=tenant, query={"limit": "100"}).body["items"])


# ---------------------------------------------------------------- public routes and auth


def test_health_and_openapi_need_no_key(api: Api) -> None:
    assert api.call("GET", "/v1/health", tenant=None).body == {"status": "ok"}
    doc = api.call("GET", "/v1/openapi.json", tenant=None)
    assert doc.status == 200
    assert doc.body["openapi"].startswith("3.")
    assert {"/v1/timers", "/v1/timers/{timer_id}", "/v1/schedule-preview"} <= set(doc.body["paths"])
    schemas = doc.body["components"]["schemas"]
    assert {"TimerCreate", "TimerOut", "ErrorOut"} <= set(schemas)
    for path in ("/v1/health", "/v1/openapi.json"):  # documented as public, like they are
        assert doc.body["paths"][path]["get"]["security"] == []
    assert doc.body["security"] == [{"apiKey": []}]


def test_openapi_declares_405_everywhere_and_415_where_a_body_is_taken(api: Api) -> None:
    paths = api.call("GET", "/v1/openapi.json", tenant=None).body["paths"]
    with_body = set()
    for path, item in paths.items():
        for method, operation in item.items():
            responses = operation["responses"]
            assert "Allow" in responses["405"]["headers"], (method, path)
            assert responses["405"]["content"]["application/json"]["schema"] == {
                "$ref": "#/components/schemas/ErrorOut"
            }
            assert ("415" in responses) == ("requestBody" in operation), (method, path)
            if "requestBody" in operation:
                with_body.add(f"{method.upper()} {path}")
    assert with_body == {
        "POST /v1/timers",
        "POST /v1/timers:batch",
        "PATCH /v1/timers/{timer_id}",
        "POST /v1/schedule-preview",
        "POST /v1/tenant/keys",
    }


@pytest.mark.parametrize("key", [None, "", "tk_not-a-key"])
def test_missing_or_unknown_key_is_401(api: Api, key: str | None) -> None:
    reply = api.call("GET", "/v1/timers", tenant=None, key=key)
    assert reply.status == 401
    assert reply.error_code == "unauthorized"


def test_revoked_key_is_401(api: Api) -> None:
    assert api.tenants.revoke_key(api.keys["acme"])
    assert api.call("GET", "/v1/tenant").status == 401


def test_a_revoked_key_the_api_remembers_is_refused_within_a_second(api: Api) -> None:
    """The api remembers keys (a read per key per 30 s, not per request); a revocation - by
    any process: here ops.admin's function - makes every sandbox forget them within 1 s."""
    key, other = api.keys["acme"], api.tenants.add_key("acme", api.clock())
    assert api.call("GET", "/v1/tenant", key=key).status == 200  # remembered from here on
    assert api.call("GET", "/v1/tenant", key=other).status == 200
    api.clock.advance(300)
    assert api.tenants.revoke_key(key)
    assert api.call("GET", "/v1/tenant", key=key).status == 200  # checked 300 ms ago: trusted
    api.clock.advance(700)  # 1 s after the last check: within a second of the revocation
    assert api.call("GET", "/v1/tenant", key=key).status == 401
    assert api.call("GET", "/v1/tenant", key=other).status == 200  # the others still work
    api.clock.advance(5_000)  # long after any check: refused at once
    assert api.tenants.revoke_key(other)
    assert api.call("GET", "/v1/tenant", key=other).status == 401


# ---------------------------------------------------------------- the tenant's own keys


def test_a_tenant_lists_creates_and_revokes_its_own_keys(api: Api) -> None:
    (first,) = api.call("GET", "/v1/tenant/keys").body["items"]
    assert first == {
        "key_id": api.keys["acme"][:10],
        "created_at": format_ms(T0),
        "last_used_at": format_ms(T0),  # this very request
        "label": None,
    }
    api.clock.advance(1_000)
    made = api.call("POST", "/v1/tenant/keys", body={"label": "ci"})
    assert made.status == 201, made.body
    secret = made.body.pop("api_key")
    assert secret.startswith("tk_") and secret[:10] == made.body["key_id"]
    assert made.body == {"key_id": secret[:10], "created_at": format_ms(T0 + 1_000),
                         "last_used_at": None, "label": "ci"}  # fmt: skip
    assert api.call("GET", "/v1/tenant", key=secret).body["tenant"] == "acme"
    listed = api.call("GET", "/v1/tenant/keys", key=secret).body["items"]
    assert [k["key_id"] for k in listed] == [first["key_id"], made.body["key_id"]]
    assert all("api_key" not in k for k in listed)  # the secret is shown once
    assert listed[1]["last_used_at"] == format_ms(T0 + 1_000)

    gone = api.call("DELETE", f"/v1/tenant/keys/{first['key_id']}", key=secret)
    assert (gone.status, gone.body) == (204, None)
    api.clock.advance(1_000)  # refused within 1 s, in every sandbox
    assert api.call("GET", "/v1/tenant").status == 401
    last = api.call("DELETE", f"/v1/tenant/keys/{made.body['key_id']}", key=secret)
    assert (last.status, last.error_code) == (409, "invalid_state")  # never the last one
    unknown = api.call("DELETE", "/v1/tenant/keys/tk_nope", key=secret)
    assert (unknown.status, unknown.error_code) == (404, "not_found")
    assert len(api.call("GET", "/v1/tenant/keys", key=secret).body["items"]) == 1


def test_a_tenant_keeps_at_most_ten_keys_and_never_sees_anothers(api: Api) -> None:
    for _ in range(9):
        assert api.call("POST", "/v1/tenant/keys", body={}).status == 201
    eleventh = api.call("POST", "/v1/tenant/keys", body={"label": "one too many"})
    assert (eleventh.status, eleventh.error_code) == (409, "invalid_state")
    assert len(api.call("GET", "/v1/tenant/keys").body["items"]) == 10
    theirs = api.call("GET", "/v1/tenant/keys", tenant="globex").body["items"]
    assert [k["key_id"] for k in theirs] == [api.keys["globex"][:10]]
    ours = api.call("GET", "/v1/tenant/keys").body["items"][1]["key_id"]
    reply = api.call("DELETE", f"/v1/tenant/keys/{ours}", tenant="globex")
    assert (reply.status, reply.error_code) == (404, "not_found")
    too_long = api.call("POST", "/v1/tenant/keys", tenant="globex", body={"label": "x" * 129})
    assert (too_long.status, too_long.error_fields) == (400, {"label"})
    assert len(api.call("GET", "/v1/tenant/keys", tenant="globex").body["items"]) == 1


# ---------------------------------------------------------------- usage

NO_LAG = {"ontime": 0, "1-200ms": 0, "200-600ms": 0, "600-1000ms": 0, "1000-2000ms": 0,
          "over_2000ms": 0}  # fmt: skip


def test_usage_counts_the_months_creates_runs_and_active_timers(api: Api) -> None:
    every = api.create(schedule={"type": "every", "seconds": 60})
    later = api.create(schedule={"type": "after", "seconds": 30})
    api.call("POST", f"/v1/timers/{later['id']}/pause")  # active: 1
    assert api.call("POST", f"/v1/timers/{every['id']}/run").status == 202
    used = api.call("GET", "/v1/tenant/usage")
    assert used.status == 200, used.body
    assert used.body == {
        "month": "2026-11",
        "fires": {"enqueued": 1, "delivered": 0, "failed": 0, "late_1s": 0},
        # run now's position is a time the reference certainly reached (its clock's error
        # bound before now): enqueued a few ms after it
        "lag": {**NO_LAG, "1-200ms": 1},
        "timers_created": 2,
        "active_timers": 1,
    }
    api.call("POST", f"/v1/timers/{later['id']}/resume")
    api.call("DELETE", f"/v1/timers/{every['id']}")
    api.call("POST", f"/v1/timers/{later['id']}/resume")  # active already: no change
    assert api.call("GET", "/v1/tenant/usage").body["active_timers"] == 1
    october = api.call("GET", "/v1/tenant/usage", query={"month": "2026-10"}).body
    assert october["fires"] == {"enqueued": 0, "delivered": 0, "failed": 0, "late_1s": 0}
    assert october["lag"] == NO_LAG  # a month with no fires: six zeros
    assert (october["month"], october["timers_created"]) == ("2026-10", 0)
    theirs = api.call("GET", "/v1/tenant/usage", tenant="globex").body
    assert (theirs["timers_created"], theirs["active_timers"]) == (0, 0)


@pytest.mark.parametrize(
    ("month", "why"),
    [
        ("2026-1", "expected YYYY-MM, e.g. 2026-11"),
        ("nov", "expected YYYY-MM, e.g. 2026-11"),
        ("2026-11-01", "expected YYYY-MM, e.g. 2026-11"),
        ("2026-13", "2026-13 is out of range: month 13 is not 01-12"),
        ("2026-00", "2026-00 is out of range: month 00 is not 01-12"),
        ("0000-05", "0000-05 is out of range: the year is 0001 to 9999"),
        # after this month (the test clock's 2026-11): a 400 that says so, not zeros
        ("2026-12", "2026-12 is in the future: this month is 2026-11 (UTC)"),
        ("3000-01", "3000-01 is in the future: this month is 2026-11 (UTC)"),
    ],
)
def test_a_month_the_usage_report_cannot_answer_is_400_saying_why(
    api: Api, month: str, why: str
) -> None:
    reply = api.call("GET", "/v1/tenant/usage", query={"month": month})
    assert (reply.status, reply.error_code) == (400, "validation_error"), reply.body
    assert reply.body["error"] == {
        "code": "validation_error", "message": f"month: {why}",
        "details": [{"field": "month", "message": why}],
    }  # fmt: skip


def test_the_first_and_the_current_month_are_answered(api: Api) -> None:
    for month in ("0001-01", "2026-11"):
        reply = api.call("GET", "/v1/tenant/usage", query={"month": month})
        assert (reply.status, reply.body["month"]) == (200, month), reply.body


def test_tenant_is_whoever_the_key_belongs_to(api: Api) -> None:
    reply = api.call("GET", "/v1/tenant", tenant="globex")
    secret = reply.body.pop("webhook_secret")
    assert reply.body == {
        "tenant": "globex",
        "callback_queue_url": api.queues["globex"],
        "retention_days": 30,
    }
    tenant = api.tenants.get_tenant("globex")
    assert tenant is not None and secret == tenant.webhook_secret
    assert secret != api.call("GET", "/v1/tenant").body["webhook_secret"]  # acme's own


# ---------------------------------------------------------------- create


@pytest.mark.parametrize(
    ("schedule", "next_fire_at"),
    [
        ({"type": "at", "at": AT}, AT),
        ({"type": "at", "at": "2026-11-21T11:00:00+01:00"}, "2026-11-21T10:00:00.000Z"),
        ({"type": "after", "seconds": 30}, "2026-11-21T10:00:30.000Z"),
        ({"type": "after", "seconds": 1.5}, "2026-11-21T10:00:01.500Z"),
        ({"type": "every", "seconds": 60}, "2026-11-21T10:01:00.000Z"),
        (
            {"type": "cron", "expression": "0 7 * * 1-5", "timezone": "Europe/Berlin"},
            "2026-11-23T06:00:00.000Z",  # Saturday -> Monday 07:00 CET
        ),
    ],
)
def test_create_each_schedule_type(api: Api, schedule: dict[str, Any], next_fire_at: str) -> None:
    timer = api.create(schedule=schedule, payload={"order": 42}, name="n")
    assert timer["status"] == "active"
    assert timer["next_fire_at"] == next_fire_at
    assert timer["payload"] == {"order": 42}
    assert timer["target"] == {"queue_url": api.queues["acme"]}
    assert timer["misfire"] == "fire_once"
    assert timer["fire_count"] == 0
    assert timer["created_at"] == timer["updated_at"] == "2026-11-21T10:00:00.000Z"
    assert api.call("GET", f"/v1/timers/{timer['id']}").body == timer


def test_cron_defaults_to_utc(api: Api) -> None:
    timer = api.create(schedule={"type": "cron", "expression": "*/15 * * * *"})
    assert timer["schedule"]["timezone"] == "UTC"
    assert timer["next_fire_at"] == "2026-11-21T10:15:00.000Z"


def test_at_up_to_five_minutes_in_the_past_fires_immediately(api: Api) -> None:
    past = format_ms(T0 - 299_000)
    assert api.create(schedule={"type": "at", "at": past})["next_fire_at"] == past


def test_create_puts_a_soon_due_timer_straight_into_redis(api: Api) -> None:
    timer = api.create(schedule={"type": "after", "seconds": 3})
    index = api.runtime.wiring.index
    bucket = index.bucket_of(stored(api, timer["id"]).partition)
    ((score, card),) = index.cards(bucket).values()
    assert (score, card.pos, card.n, card.timer.rev) == (T0 + 3000, T0 + 3000, 0, 1)


def test_far_future_timer_is_left_to_the_migrator(api: Api) -> None:
    api.create(schedule={"type": "at", "at": "2027-01-01T00:00:00Z"})
    assert indexed(api) == set()


def bad(**overrides: Any) -> dict[str, Any]:
    return {"schedule": {"type": "after", "seconds": 5}, **overrides}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "schedule"),
        (bad(color="red"), "color"),
        (bad(schedule={"type": "sometimes"}), "schedule.type"),
        (bad(schedule={"type": "cron", "expression": "61 * * * *"}), "schedule.expression"),
        (bad(schedule={"type": "cron", "expression": "0 7 * * * *"}), "schedule.expression"),
        (bad(schedule={"type": "cron", "expression": "@daily"}), "schedule.expression"),
        (
            bad(schedule={"type": "cron", "expression": "0 7 * * *", "timezone": "Mars/Olympus"}),
            "schedule.timezone",
        ),
        (bad(schedule={"type": "at", "at": "2026-11-21T09:54:00Z"}), "schedule.at"),
        (bad(schedule={"type": "at", "at": "2026-11-21T12:00:00"}), "schedule.at"),
        (bad(schedule={"type": "at", "at": "tomorrow"}), "schedule.at"),
        (bad(schedule={"type": "at", "at": 1795255200}), "schedule.at"),
        (bad(schedule={"type": "after", "seconds": -1}), "schedule.seconds"),
        (bad(schedule={"type": "after", "seconds": "5"}), "schedule.seconds"),
        (bad(schedule={"type": "every", "seconds": 0.5}), "schedule.seconds"),
        (bad(schedule={"type": "every", "seconds": 60, "extra": 1}), "schedule.extra"),
        (bad(max_fires=0), "max_fires"),
        (bad(max_fires=True), "max_fires"),
        (bad(name="x" * 257), "name"),
        (bad(misfire="sometimes"), "misfire"),
        (bad(start_at="2026-11-22T00:00:00Z", end_at="2026-11-21T12:00:00Z"), "end_at"),
        (bad(start_at="9999-12-31T23:59:59Z"), "start_at"),  # found by fuzzing: was a 500
        (bad(end_at="0001-01-01T00:00:00+01:00"), "end_at"),  # year 0
        (bad(target={"queue_url": 5}), "target.queue_url"),
        (
            bad(target={"queue_url": "https://sqs.us-east-1.amazonaws.com/1/elsewhere"}),
            "target.queue_url",
        ),
    ],
)
def test_bad_input_is_400_with_the_field_and_creates_nothing(
    api: Api, body: dict[str, Any], field: str
) -> None:
    reply = api.call("POST", "/v1/timers", body=body)
    assert reply.status == 400, reply.body
    assert reply.error_code == "validation_error"
    assert field in reply.error_fields, reply.body
    assert_in_plain_words(reply)
    assert timer_count(api) == 0


PYDANTIC_WORDS = ("Input should", "Field required", "dictionary", "Value error", "instance of",
                  "Extra inputs", "Unable to extract")  # fmt: skip


def assert_in_plain_words(reply: Reply) -> None:
    """A 400 names each field as the contract does and says what is wrong in plain words, in
    its details and in its message - never in the words of the framework's model library."""
    error = reply.body["error"]
    assert not [w for w in PYDANTIC_WORDS if w in json.dumps(error)], error
    for detail in error["details"][:3]:
        assert f"{detail['field']}: {detail['message']}" in error["message"], error


@pytest.mark.parametrize(
    ("body", "field", "sentence"),
    [
        ({}, "schedule", "is required"),
        ({"schedule": "soon"}, "schedule", "must be a JSON object"),
        (bad(schedule={"type": "sometimes"}), "schedule.type",
         "must be 'at', 'after', 'cron' or 'every', not 'sometimes'"),
        (bad(schedule={}), "schedule.type", "is required: 'at', 'after', 'cron' or 'every'"),
        (bad(schedule={"type": "every", "seconds": 0}), "schedule.seconds", "must be at least 1"),
        (bad(schedule={"type": "after", "seconds": "5"}), "schedule.seconds", "must be a number"),
        (bad(schedule={"type": "cron"}), "schedule.expression", "is required"),
        (bad(max_fires=1.5), "max_fires", "must be a whole number"),
        (bad(name="x" * 257), "name", "must be at most 256 characters"),
        (bad(misfire="x"), "misfire", "must be 'fire_once', 'fire_all' or 'skip'"),
        (bad(target="q"), "target", "must be a JSON object"),
        (bad(target={"url": "https://a.example", "headers": {"a": 1}}), "target.headers.a",
         "must be a string"),
        (bad(colour="red"), "colour", "is not a field of this request"),
        (bad(schedule={"type": "at", "at": "tomorrow"}), "schedule.at",
         "expected an RFC 3339 date-time with an offset, e.g. 2026-11-21T10:00:00Z"),
    ],
)  # fmt: skip
def test_a_400_says_what_is_wrong_in_plain_words(
    api: Api, body: dict[str, Any], field: str, sentence: str
) -> None:
    reply = api.call("POST", "/v1/timers", body=body)
    assert reply.status == 400, reply.body
    assert {"field": field, "message": sentence} in reply.body["error"]["details"], reply.body
    assert f"{field}: {sentence}" in reply.body["error"]["message"]
    assert_in_plain_words(reply)


def test_a_400_of_a_query_or_a_batch_is_in_plain_words_too(api: Api) -> None:
    listing = api.call("GET", "/v1/timers", query={"limit": "0"})
    assert listing.body["error"]["message"] == "limit: must be at least 1"
    batch = api.call("POST", "/v1/timers:batch", body={"timers": []})
    assert batch.body["error"]["message"] == "timers: must not be empty"
    for reply in (listing, batch):
        assert_in_plain_words(reply)


@pytest.mark.parametrize(
    "host",
    [
        "127.0.0.1", "127.8.8.8", "[::1]",  # loopback
        "10.1.2.3", "172.16.0.1", "192.168.1.1", "[fd12::1]",  # private, unique local
        "169.254.169.254", "[fd00:ec2::254]", "[fe80::1]",  # metadata, link-local
        "0.0.0.0", "[::]",  # unspecified
        "[64:ff9b::a9fe:a9fe]", "[64:ff9b::a00:1]",  # NAT64 of the metadata endpoint, of 10/8
        "[2002:a9fe:a9fe::1]", "[2002:c0a8:101::1]",  # 6to4 of the same
        "[::ffff:127.0.0.1]", "[::ffff:10.0.0.1]",  # IPv4-mapped
        "100.64.0.1", "192.0.2.1", "198.18.0.1", "224.0.0.1", "240.0.0.1",  # CGNAT, docs, ...
        "[2001:db8::1]", "[fec0::1]", "[ff02::1]", "[2001::1]",  # docs, site-local, mcast, Teredo
    ],
)  # fmt: skip
def test_a_webhook_to_a_non_public_address_literal_is_400_at_create_and_patch(
    api: Api, host: str
) -> None:
    url = f"https://{host}/hook"
    reply = api.call("POST", "/v1/timers", body=bad(target={"url": url}))
    assert (reply.status, reply.error_code, reply.error_fields) == (
        400, "validation_error", {"target.url"},
    ), reply.body  # fmt: skip
    assert "not a public address" in reply.body["error"]["message"]
    assert timer_count(api) == 0
    made = api.create(**bad(target={"url": "https://hooks.example.com/h"}))
    patched = api.call("PATCH", f"/v1/timers/{made['id']}", body={"target": {"url": url}})
    assert (patched.status, patched.error_fields) == (400, {"target.url"})
    assert api.call("GET", f"/v1/timers/{made['id']}").body["target"]["url"] == (
        "https://hooks.example.com/h"
    )


def test_public_literals_are_accepted_and_loopback_only_where_the_stack_allows_it(
    api: Api,
) -> None:
    for url in (
        "https://93.184.216.34/h",
        "https://[2606:2800:220:1:248:1893:25c8:1946]/h",
        "https://[64:ff9b::5db8:d822]/h",
    ):  # fmt: skip  (NAT64 of a public address)
        assert api.call("POST", "/v1/timers", body=bad(target={"url": url})).status == 201, url
    loopback = bad(target={"url": "http://127.0.0.1:9/h"})
    assert api.call("POST", "/v1/timers", body=loopback).status == 400
    api.runtime.service.allow_loopback_targets = True  # TIMERS_ALLOW_LOOPBACK_TARGETS=1
    assert api.call("POST", "/v1/timers", body=loopback).status == 201
    for url in ("https://[::1]:9/h", "http://127.0.0.1:9/h"):
        assert api.call("POST", "/v1/timers", body=bad(target={"url": url})).status == 201
    other = bad(target={"url": "https://127.0.0.2:9/h"})  # the rest of 127/8 stays refused
    assert api.call("POST", "/v1/timers", body=other).status == 400


@pytest.mark.parametrize(
    "url",
    ["http://127.0.0.1:9/h", "https://127.0.0.1/h", "http://localhost:8080/h",
     "https://[::1]:9/h", "http://[::1]:9/h"],
)  # fmt: skip
def test_on_the_local_stack_a_refused_loopback_target_names_the_setting_that_allows_it(
    aws: None, clock: FakeClock, redis_url: str, monkeypatch: pytest.MonkeyPatch, url: str
) -> None:
    api = make_api(monkeypatch, clock, redis_url, timers_local_stack=True)  # as `make run` sets
    reply = api.call("POST", "/v1/timers", body=bad(target={"url": url}))
    assert (reply.status, reply.error_code) == (400, "validation_error"), reply.body
    assert reply.body["error"]["details"] == [{"field": "target.url", "message": LOOPBACK_REFUSED}]
    assert reply.body["error"]["message"] == (
        "target.url: is a loopback address: loopback targets are refused; on the local stack, "
        "start it with TIMERS_ALLOW_LOOPBACK_TARGETS=1 to allow them (plain http too)"
    )
    made = api.create(**bad(target={"url": "https://hooks.example.com/h"}))
    patched = api.call("PATCH", f"/v1/timers/{made['id']}", body={"target": {"url": url}})
    assert patched.body["error"]["details"] == reply.body["error"]["details"]
    api.runtime.service.allow_loopback_targets = True  # TIMERS_ALLOW_LOOPBACK_TARGETS=1
    assert api.call("POST", "/v1/timers", body=bad(target={"url": url})).status == 201


def test_a_loopback_target_is_refused_as_before_off_the_local_stack_and_beyond_127_0_0_1(
    aws: None, clock: FakeClock, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    api = make_api(monkeypatch, clock, redis_url)  # AWS: no word of the local stack's settings
    for url, says in [("http://127.0.0.1:9/h", "must use https"),
                      ("https://127.0.0.1/h", "is not a public address"),
                      ("http://localhost/h", "must use https")]:  # fmt: skip
        reply = api.call("POST", "/v1/timers", body=bad(target={"url": url}))
        assert reply.status == 400 and says in reply.body["error"]["message"], reply.body
        assert "TIMERS_ALLOW_LOOPBACK_TARGETS" not in json.dumps(reply.body)
    # On the local stack, an address the setting would not allow gets no hint either; and what
    # is accepted is the same as on AWS: a name is judged at delivery, where it is resolved.
    for local_stack in (False, True):
        api.runtime.service.local_stack = local_stack
        named = bad(target={"url": "https://localhost/h"})
        assert api.call("POST", "/v1/timers", body=named).status == 201
    other = api.call("POST", "/v1/timers", body=bad(target={"url": "https://127.0.0.2/h"}))
    assert other.status == 400 and "TIMERS_ALLOW" not in other.body["error"]["message"]


@pytest.mark.parametrize("raw", ["{not json", "", "[]", "null", '"text"'])
def test_malformed_or_non_object_body_is_400(api: Api, raw: str) -> None:
    reply = api.call("POST", "/v1/timers", raw_body=raw)
    assert reply.status == 400
    assert reply.error_code == "validation_error"
    assert timer_count(api) == 0


def test_base64_encoded_body_is_accepted(api: Api) -> None:
    event = apigw.event(
        "POST",
        "/v1/timers",
        body={"schedule": {"type": "after", "seconds": 1}},
        headers={"x-api-key": api.keys["acme"]},
    )
    assert event["isBase64Encoded"] is False  # JSON is text to an HTTP API ...
    event["body"] = base64.b64encode(event["body"].encode()).decode()
    event["isBase64Encoded"] = True  # ... but the function takes either
    assert api.send(event).status == 201


def test_a_body_without_content_type_is_parsed_as_json(api: Api) -> None:
    event = apigw.event(
        "POST",
        "/v1/timers",
        body={"schedule": {"type": "after", "seconds": 1}, "payload": {"k": "ü"}},
        headers={"x-api-key": api.keys["acme"]},
        content_type=None,
    )
    assert "content-type" not in event["headers"]
    assert event["isBase64Encoded"] is True  # an HTTP API base64-encodes an untyped body
    reply = api.send(event)
    assert reply.status == 201, reply.body
    assert reply.body["payload"] == {"k": "ü"}
    assert timer_count(api) == 1
    timer = api.create(**bad())
    reply = api.call(
        "PATCH", f"/v1/timers/{timer['id']}", body={"name": "renamed"}, content_type=None
    )
    assert (reply.status, reply.body["name"]) == (200, "renamed")


@pytest.mark.parametrize(
    "content_type",
    [
        "application/json; charset=utf-8",
        "Application/JSON",
        "application/merge-patch+json",
        "application/vnd.timers+json;version=1",
    ],
)
def test_every_json_content_type_is_accepted(api: Api, content_type: str) -> None:
    created = api.call("POST", "/v1/timers", body=bad(), content_type=content_type)
    assert created.status == 201, created.body
    reply = api.call(
        "PATCH", f"/v1/timers/{created.body['id']}", body={"name": "n"}, content_type=content_type
    )
    assert (reply.status, reply.body["name"]) == (200, "n")
    preview = api.call(
        "POST",
        "/v1/schedule-preview",
        body={"schedule": bad()["schedule"]},
        content_type=content_type,
    )
    assert preview.status == 200, preview.body


NOT_JSON = [
    ("text/plain", json.dumps(bad())),
    ("text/plain; charset=utf-8", json.dumps(bad())),
    ("application/x-www-form-urlencoded", "schedule=after&seconds=5"),  # curl -d's default
    ("application/x-www-form-urlencoded", json.dumps(bad())),  # curl -d '{...}', no -H
    ("multipart/form-data; boundary=x", '--x\r\nContent-Disposition: form-data; name="a"\r\n\r\n1'),
    ("application/xml", "<timer/>"),
    ("application/octet-stream", json.dumps(bad())),
]


def _is_415(reply: Any, content_type: str) -> None:
    assert reply.status == 415, reply.body
    assert reply.error_code == "unsupported_media_type"
    assert "Content-Type: application/json" in reply.body["error"]["message"]
    assert content_type in reply.body["error"]["message"]
    assert reply.error_fields == {"content-type"}


@pytest.mark.parametrize(("content_type", "raw"), NOT_JSON)
def test_a_body_that_is_not_json_is_415_and_creates_nothing(
    api: Api, content_type: str, raw: str
) -> None:
    _is_415(api.call("POST", "/v1/timers", raw_body=raw, content_type=content_type), content_type)
    _is_415(
        api.call("POST", "/v1/schedule-preview", raw_body=raw, content_type=content_type),
        content_type,
    )
    assert timer_count(api) == 0
    assert indexed(api) == set()


@pytest.mark.parametrize(("content_type", "raw"), NOT_JSON)
def test_a_patch_that_is_not_json_is_415_and_changes_nothing(
    api: Api, content_type: str, raw: str
) -> None:
    timer = api.create(**bad())
    patch = json.dumps({"name": "changed", "schedule": {"type": "every", "seconds": 9}})
    for body in (raw, patch):
        reply = api.call(
            "PATCH", f"/v1/timers/{timer['id']}", raw_body=body, content_type=content_type
        )
        _is_415(reply, content_type)
    assert api.call("GET", f"/v1/timers/{timer['id']}").body == timer


def test_a_content_type_on_a_route_without_a_body_is_ignored(api: Api) -> None:
    timer = api.create(schedule={"type": "every", "seconds": 60})
    reply = api.call("POST", f"/v1/timers/{timer['id']}/pause", content_type="text/plain")
    assert (reply.status, reply.body["status"]) == (200, "paused")
    assert api.call("GET", "/v1/tenant", content_type="text/html").status == 200


def test_a_body_that_is_not_utf8_is_400_not_a_crash(api: Api) -> None:
    reply = api.call("POST", "/v1/timers", raw_body=b"\xff\xfe{}")
    assert (reply.status, reply.error_code) == (400, "validation_error")
    assert reply.error_fields == {"body"}
    assert timer_count(api) == 0


def test_payload_over_64_kib_is_413(api: Api) -> None:
    reply = api.call("POST", "/v1/timers", body=bad(payload="x" * (64 * 1024)))
    assert reply.status == 413
    assert reply.error_code == "payload_too_large"
    assert timer_count(api) == 0


def test_payload_of_exactly_64_kib_is_accepted(api: Api) -> None:
    assert api.create(**bad(payload="x" * (64 * 1024 - 2)))["payload"] == "x" * (64 * 1024 - 2)


def test_request_body_over_256_kib_is_413(api: Api) -> None:
    reply = api.call("POST", "/v1/timers", raw_body=json.dumps(bad(name="y" * (257 * 1024))))
    assert reply.status == 413
    assert reply.error_code == "payload_too_large"


def test_payload_is_kept_verbatim(api: Api) -> None:
    payload = {"nested": [1, 2.5, None, True, "ü"], "empty": {}}
    timer = api.create(**bad(payload=payload))
    assert api.call("GET", f"/v1/timers/{timer['id']}").body["payload"] == payload


# ---------------------------------------------------------------- targets


def test_only_registered_queues_may_be_targeted(api: Api) -> None:
    other = boto3.client("sqs").create_queue(QueueName="acme-extra")["QueueUrl"]
    assert api.call("POST", "/v1/timers", body=bad(target={"queue_url": other})).status == 400
    api.tenants.allow_queue("acme", other)
    api.clock.advance(AUTH_CACHE_MS)  # an api instance re-reads its tenants that often
    assert api.create(**bad(target={"queue_url": other}))["target"]["queue_url"] == other
    # another tenant's callback queue is never a valid target
    theirs = bad(target={"queue_url": api.queues["globex"]})
    assert api.call("POST", "/v1/timers", body=theirs).status == 400


# ---------------------------------------------------------------- retry policy


def test_a_retry_policy_is_stored_echoed_and_changed_by_patch(api: Api) -> None:
    timer = api.create(
        schedule={"type": "every", "seconds": 60},
        target={"url": "https://example.com/hook"},
        retry={"max_attempts": 3, "max_age_seconds": 600},
    )
    assert timer["retry"] == {"max_attempts": 3, "max_age_seconds": 600}
    assert api.call("GET", f"/v1/timers/{timer['id']}").body["retry"] == timer["retry"]
    assert stored(api, timer["id"]).retry == RetryPolicy(3, 600)
    patched = api.call("PATCH", f"/v1/timers/{timer['id']}", body={"retry": {"max_attempts": 1}})
    assert patched.body["retry"] == {"max_attempts": 1, "max_age_seconds": None}
    cleared = api.call("PATCH", f"/v1/timers/{timer['id']}", body={"retry": None})
    assert cleared.body["retry"] is None  # the default: no cap, 24 h
    plain = api.create(schedule={"type": "after", "seconds": 30})
    assert plain["retry"] is None


@pytest.mark.parametrize(
    ("retry", "field"),
    [
        ({"max_attempts": 0}, "retry.max_attempts"),
        ({"max_attempts": 101}, "retry.max_attempts"),
        ({"max_attempts": 2.5}, "retry.max_attempts"),
        ({"max_age_seconds": 59}, "retry.max_age_seconds"),
        ({"max_age_seconds": 86_401}, "retry.max_age_seconds"),
        ({"max_tries": 3}, "retry.max_tries"),
    ],
)
def test_a_bad_retry_policy_is_400_naming_it_and_changes_nothing(
    api: Api, retry: dict[str, Any], field: str
) -> None:
    hook = {"url": "https://example.com/hook"}
    body = {"schedule": {"type": "after", "seconds": 30}, "target": hook, "retry": retry}
    reply = api.call("POST", "/v1/timers", body=body)
    assert (reply.status, reply.error_code) == (400, "validation_error")
    assert reply.error_fields == {field}, reply.body
    assert timer_count(api) == 0
    timer = api.create(
        schedule={"type": "after", "seconds": 30}, target=hook, retry={"max_attempts": 5}
    )
    reply = api.call("PATCH", f"/v1/timers/{timer['id']}", body={"retry": retry})
    assert (reply.status, reply.error_code) == (400, "validation_error")
    assert api.call("GET", f"/v1/timers/{timer['id']}").body == timer


def test_a_retry_policy_on_a_queue_target_is_400_and_changes_nothing(api: Api) -> None:
    """A retry policy bounds an HTTP fire's POSTs; a queue target's send is retried by the
    service itself (then failed with its reason): a policy there would say nothing, so it is
    refused - at create, by a PATCH that adds one, and by one that moves an HTTP timer with a
    policy to a queue (clear it in the same PATCH)."""
    body = {"schedule": {"type": "after", "seconds": 30}, "retry": {"max_attempts": 3}}
    reply = api.call("POST", "/v1/timers", body=body)
    assert (reply.status, reply.error_fields) == (400, {"retry"}), reply.body
    assert timer_count(api) == 0
    queued = api.create(schedule={"type": "after", "seconds": 30})
    reply = api.call("PATCH", f"/v1/timers/{queued['id']}", body={"retry": {"max_attempts": 3}})
    assert (reply.status, reply.error_fields) == (400, {"retry"}), reply.body
    hook = {"url": "https://example.com/hook"}
    hooked = api.create(
        schedule={"type": "after", "seconds": 30}, target=hook, retry={"max_attempts": 3}
    )
    to_queue = {"target": {"queue_url": queued["target"]["queue_url"]}}
    reply = api.call("PATCH", f"/v1/timers/{hooked['id']}", body=to_queue)
    assert (reply.status, reply.error_fields) == (400, {"retry"}), reply.body
    for timer in (queued, hooked):
        assert api.call("GET", f"/v1/timers/{timer['id']}").body == timer
    moved = api.call("PATCH", f"/v1/timers/{hooked['id']}", body={**to_queue, "retry": None})
    assert (moved.status, moved.body["retry"], moved.body["target"]) == (
        200, None, to_queue["target"]
    )  # fmt: skip


# ---------------------------------------------------------------- idempotency


def test_a_batch_names_each_invalid_timer_by_its_index_and_creates_none(api: Api) -> None:
    good = {"schedule": {"type": "at", "at": AT}}
    # Checked in three stages - the request model, the schedules' parser, the service - and
    # each names the timer by its index.
    for batch, fields in [
        ([good, {**good, "max_fires": 0}], {"timers[1].max_fires"}),
        (
            [good, {"schedule": {"type": "cron", "expression": "61 * * * *"}},
             {"schedule": {"type": "cron", "expression": "0 * * * *", "timezone": "Mars/X"}}],
            {"timers[1].schedule.expression", "timers[2].schedule.timezone"},
        ),
        ([good, {**good, "end_at": format_ms(T0)}], {"timers[1].schedule"}),  # due after end
    ]:  # fmt: skip
        reply = api.call("POST", "/v1/timers:batch", body={"timers": batch})
        assert reply.status == 400 and reply.error_code == "validation_error"
        assert reply.error_fields == fields, reply.body
    assert timer_count(api) == 0


def test_same_idempotency_key_and_body_returns_the_original(api: Api) -> None:
    headers = {"Idempotency-Key": "order-42"}
    first = api.call("POST", "/v1/timers", body=bad(), headers=headers)
    api.clock.advance(5_000)
    again = api.call("POST", "/v1/timers", body=bad(), headers=headers)
    assert first.status == again.status == 201
    assert again.body == first.body
    assert timer_count(api) == 1


def test_same_idempotency_key_with_another_body_is_409(api: Api) -> None:
    headers = {"Idempotency-Key": "order-42"}
    api.call("POST", "/v1/timers", body=bad(), headers=headers)
    reply = api.call("POST", "/v1/timers", body=bad(name="other"), headers=headers)
    assert reply.status == 409
    assert reply.error_code == "idempotency_conflict"
    assert timer_count(api) == 1


class Died(Exception):
    """The first attempt's process dies here (the api answers 500)."""


@pytest.mark.parametrize("batch", [False, True])
def test_a_retry_after_the_first_attempt_died_keeps_its_timers(
    api: Api, monkeypatch: pytest.MonkeyPatch, batch: bool
) -> None:
    """The first attempt stored its timers and died before recording its answer: the retry
    answers with those timers (same ids) and they stay (it used to delete them: 404)."""
    path, body = ("/v1/timers", bad())
    if batch:
        path, body = "/v1/timers:batch", {"timers": [bad(), bad()]}
    headers = {"Idempotency-Key": "order-7"}
    store = api.runtime.service.idempotency

    def dies(*_: Any) -> None:
        raise Died

    with monkeypatch.context() as patch:
        patch.setattr(store, "complete", dies)
        assert api.call("POST", path, body=body, headers=headers).status == 500
    made = {t["id"] for t in api.call("GET", "/v1/timers").body["items"]}
    assert len(made) == (2 if batch else 1)  # the first attempt's timers exist
    api.clock.advance(2_000)
    again = api.call("POST", path, body=body, headers=headers)
    assert again.status == 201, again.body
    answered = {t["id"] for t in (again.body["items"] if batch else [again.body])}
    assert answered == made
    for timer_id in made:
        assert api.call("GET", f"/v1/timers/{timer_id}").status == 200
    assert api.call("POST", path, body=body, headers=headers).body == again.body


def test_two_attempts_at_once_make_one_set_of_timers_and_lose_none(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second attempt arrives while the first is storing its timers: both answer the same
    timers, which exist (the in-flight variant used to delete the timer: 404)."""
    headers = {"Idempotency-Key": "order-8"}
    timers = api.runtime.service.timers
    create_guarded = timers.create_guarded
    answers: list[Any] = []

    def slow_first(created: Any, guard: Any, stored: Any) -> Any:
        if not answers:  # the second attempt runs to its end while the first is here
            answers.append(None)
            answers[0] = api.call("POST", "/v1/timers", body=bad(), headers=headers)
        return create_guarded(created, guard, stored)

    monkeypatch.setattr(timers, "create_guarded", slow_first)
    first = api.call("POST", "/v1/timers", body=bad(), headers=headers)
    second = answers[0]
    assert first.status == second.status == 201, (first.body, second.body)
    assert first.body == second.body
    assert api.call("GET", f"/v1/timers/{first.body['id']}").status == 200
    assert timer_count(api) == 1


def test_a_big_batch_answer_is_replayed_without_storing_it(api: Api) -> None:
    """Four 60 KB non-ASCII payloads: a whole answer stored with the key (non-ASCII escaped)
    outgrew DynamoDB's 400 KB item and answered 500 after the timers existed."""
    batch = {"timers": [bad(payload="é" * 30_000 + str(i)) for i in range(4)]}
    raw = json.dumps(batch, ensure_ascii=False).encode()  # 240 KB of UTF-8: under 256 KiB
    headers = {"Idempotency-Key": "big"}
    first = api.call("POST", "/v1/timers:batch", raw_body=raw, headers=headers)
    assert first.status == 201, first.body
    api.clock.advance(60_000)
    again = api.call("POST", "/v1/timers:batch", raw_body=raw, headers=headers)
    assert again.status == 201 and again.body == first.body
    assert timer_count(api) == 4


def test_a_replay_answers_the_original_even_when_the_body_is_no_longer_valid(api: Api) -> None:
    """An ``at`` four minutes in the past is valid once; retried ten minutes later, the same
    request still answers the original (not a 400 for a time now too far in the past)."""
    body = bad(schedule={"type": "at", "at": format_ms(T0 - 240_000)})
    headers = {"Idempotency-Key": "late-retry"}
    first = api.call("POST", "/v1/timers", body=body, headers=headers)
    assert first.status == 201, first.body
    api.clock.advance(600_000)
    again = api.call("POST", "/v1/timers", body=body, headers=headers)
    assert again.status == 201 and again.body == first.body


def test_idempotency_keys_are_per_tenant_and_expire_after_24h(api: Api) -> None:
    headers = {"Idempotency-Key": "k"}
    a = api.call("POST", "/v1/timers", body=bad(), headers=headers).body
    b = api.call("POST", "/v1/timers", tenant="globex", body=bad(), headers=headers).body
    assert a["id"] != b["id"]
    api.clock.advance(24 * 3_600_000 + 1)
    reply = api.call("POST", "/v1/timers", body=bad(name="new"), headers=headers)
    assert reply.status == 201  # the old record expired: the key is free again


# ---------------------------------------------------------------- read, list, cursors


def test_list_paginates_with_opaque_cursors(api: Api) -> None:
    ids = {api.create(**bad())["id"] for _ in range(5)}
    seen: list[str] = []
    cursor = None
    while True:
        query = {"limit": "2", **({"cursor": cursor} if cursor else {})}
        page = api.call("GET", "/v1/timers", query=query).body
        seen += [t["id"] for t in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert sorted(seen) == sorted(ids)


@pytest.fixture
def api_on_tables(
    aws_tables: str | None, clock: FakeClock, redis_target: RedisTarget,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Api]:  # fmt: skip
    """The api on moto, or (make test-real) on DynamoDB Local and a Redis Cluster."""
    yield make_api(monkeypatch, clock, redis_target)


@pytest.mark.real_parts
@pytest.mark.parametrize("big", [False, True])
def test_a_page_that_ends_the_listing_has_no_cursor(api_on_tables: Api, big: bool) -> None:
    """Exactly ``limit`` timers: DynamoDB answers a LastEvaluatedKey all the same (moto does
    not), which sent the client for an empty page; the last timer's payload item follows it."""
    api = api_on_tables
    payload = {"big": "x" * 2_000} if big else 1
    for _ in range(2):
        api.create(**bad(payload=payload))
    page = api.call("GET", "/v1/timers", query={"limit": "2"}).body
    assert len(page["items"]) == 2 and page["next_cursor"] is None
    first = api.call("GET", "/v1/timers", query={"limit": "1"}).body
    assert first["next_cursor"] is not None
    rest = api.call("GET", "/v1/timers", query={"limit": "1", "cursor": first["next_cursor"]}).body
    assert len(rest["items"]) == 1 and rest["next_cursor"] is None


def test_list_filters_by_status(api: Api) -> None:
    keep = api.create(**bad())
    paused = api.create(**bad())
    api.call("POST", f"/v1/timers/{paused['id']}/pause")
    page = api.call("GET", "/v1/timers", query={"status": "paused"}).body
    assert [t["id"] for t in page["items"]] == [paused["id"]]
    active = api.call("GET", "/v1/timers", query={"status": "active"}).body
    assert [t["id"] for t in active["items"]] == [keep["id"]]


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ({"limit": "0"}, "limit"),
        ({"limit": "101"}, "limit"),
        ({"limit": "ten"}, "limit"),
        ({"status": "sleeping"}, "status"),
        ({"cursor": "garbage"}, "cursor"),
    ],
)
def test_bad_list_query_is_400(api: Api, query: dict[str, str], field: str) -> None:
    reply = api.call("GET", "/v1/timers", query=query)
    assert reply.status == 400
    assert field in reply.error_fields


def test_a_cursor_cannot_be_replayed_by_another_tenant(api: Api) -> None:
    for _ in range(3):
        api.create(**bad())
    cursor = api.call("GET", "/v1/timers", query={"limit": "1"}).body["next_cursor"]
    assert cursor
    reply = api.call("GET", "/v1/timers", tenant="globex", query={"limit": "1", "cursor": cursor})
    assert reply.status == 400
    assert "cursor" in reply.error_fields


# ---------------------------------------------------------------- change


def test_patch_recomputes_the_next_fire(api: Api) -> None:
    timer = api.create(schedule={"type": "every", "seconds": 60})
    api.clock.advance(10_000)
    reply = api.call(
        "PATCH",
        f"/v1/timers/{timer['id']}",
        body={"schedule": {"type": "every", "seconds": 5}, "name": "faster", "payload": [1]},
    )
    assert reply.status == 200, reply.body
    assert reply.body["next_fire_at"] == "2026-11-21T10:00:15.000Z"
    assert reply.body["name"] == "faster"
    assert reply.body["payload"] == [1]
    assert reply.body["updated_at"] == "2026-11-21T10:00:10.000Z"


def fired(api: Api, timer_id: str, times: int) -> None:
    """Claim and record fires the way the trigger does (its own tests cover how)."""
    fire(api.runtime.wiring.log, stored(api, timer_id), times)


def test_lowering_max_fires_to_what_already_fired_completes(api: Api) -> None:
    timer = api.create(schedule={"type": "every", "seconds": 60}, max_fires=5)
    fired(api, timer["id"], 2)  # at 10:01 and 10:02
    api.clock.advance(150_000)
    reply = api.call("PATCH", f"/v1/timers/{timer['id']}", body={"max_fires": 2})
    assert reply.body["status"] == "completed"
    assert reply.body["next_fire_at"] is None
    again = api.call("PATCH", f"/v1/timers/{timer['id']}", body={"max_fires": 3})
    assert again.body["status"] == "active"  # raised again: it has a fire left
    assert again.body["next_fire_at"] == "2026-11-21T10:03:00.000Z"  # after 10:01 and 10:02
    assert again.body["fire_count"] == 2


def test_patch_that_leaves_no_fire_at_all_is_400(api: Api) -> None:
    timer = api.create(schedule={"type": "every", "seconds": 60})
    reply = api.call("PATCH", f"/v1/timers/{timer['id']}", body={"end_at": format_ms(T0 + 1000)})
    assert reply.status == 400
    assert api.call("GET", f"/v1/timers/{timer['id']}").body == timer


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"schedule": None}, "schedule"),
        ({"misfire": None}, "misfire"),
        ({"status": "active"}, "status"),
        ({"schedule": {"type": "cron", "expression": "nope"}}, "schedule.expression"),
    ],
)
def test_bad_patch_is_400_and_changes_nothing(api: Api, body: dict[str, Any], field: str) -> None:
    timer = api.create(**bad())
    reply = api.call("PATCH", f"/v1/timers/{timer['id']}", body=body)
    assert reply.status == 400
    assert field in reply.error_fields
    assert api.call("GET", f"/v1/timers/{timer['id']}").body == timer


def test_times_before_the_year_1000_keep_four_digit_years(api: Api) -> None:
    # Found by fuzzing: start_at 0605-08-21 came back as "605-08-21T...", not RFC 3339.
    body = {"schedule": {"type": "every", "seconds": 60}, "start_at": "0605-08-21T21:11:51Z"}
    reply = api.call("POST", "/v1/timers", body=body)
    assert reply.status == 201, reply.body
    assert reply.body["start_at"] == "0605-08-21T21:11:51.000Z"


def test_pause_and_resume(api: Api) -> None:
    timer = api.create(schedule={"type": "every", "seconds": 60}, misfire="skip")
    paused = api.call("POST", f"/v1/timers/{timer['id']}/pause").body
    assert paused["status"] == "paused"
    api.clock.advance(150_000)  # two occurrences pass while paused
    resumed = api.call("POST", f"/v1/timers/{timer['id']}/resume").body
    assert resumed["status"] == "active"
    assert resumed["next_fire_at"] == "2026-11-21T10:03:00.000Z"  # skip: none of the missed


def test_resume_with_fire_once_catches_up_once(api: Api) -> None:
    timer = api.create(schedule={"type": "every", "seconds": 60})
    api.call("POST", f"/v1/timers/{timer['id']}/pause")
    api.clock.advance(150_000)
    resumed = api.call("POST", f"/v1/timers/{timer['id']}/resume").body
    assert resumed["next_fire_at"] == "2026-11-21T10:02:00.000Z"  # the latest missed, once


def test_paused_timer_leaves_redis_and_returns_on_resume(api: Api) -> None:
    timer = api.create(schedule={"type": "after", "seconds": 30})
    assert indexed(api) == {(timer["id"], T0 + 30_000, 1)}
    api.call("POST", f"/v1/timers/{timer['id']}/pause")
    assert indexed(api) == set()
    api.call("POST", f"/v1/timers/{timer['id']}/resume")  # a new revision: rev 3
    assert indexed(api) == {(timer["id"], T0 + 30_000, 3)}


def test_completed_timer_cannot_be_paused_or_resumed(api: Api) -> None:
    timer = api.create(schedule={"type": "every", "seconds": 60}, max_fires=1)
    fired(api, timer["id"], 1)
    done = api.call("PATCH", f"/v1/timers/{timer['id']}", body={"max_fires": 1}).body
    assert done["status"] == "completed"
    for action in ("pause", "resume"):
        reply = api.call("POST", f"/v1/timers/{timer['id']}/{action}")
        assert reply.status == 409
        assert reply.error_code == "invalid_state"


# ---------------------------------------------------------------- reset


@pytest.mark.parametrize(
    ("schedule", "next_fire_at"),
    [
        ({"type": "after", "seconds": 30}, "2026-11-21T10:05:30.000Z"),  # now + seconds
        ({"type": "every", "seconds": 60}, "2026-11-21T10:06:00.000Z"),  # now + period
        ({"type": "cron", "expression": "*/7 * * * *"}, "2026-11-21T10:07:00.000Z"),
        ({"type": "at", "at": "2026-11-21T11:00:00Z"}, "2026-11-21T11:00:00.000Z"),
    ],
)
def test_reset_restarts_the_schedule_from_now(
    api: Api, schedule: dict[str, Any], next_fire_at: str
) -> None:
    timer = api.create(schedule=schedule)
    api.clock.advance(300_000)  # 10:05
    reply = api.call("POST", f"/v1/timers/{timer['id']}/reset")
    assert reply.status == 200, reply.body
    assert reply.body["next_fire_at"] == next_fire_at
    assert (reply.body["status"], reply.body["fire_count"]) == ("active", 0)
    assert reply.body["updated_at"] == "2026-11-21T10:05:00.000Z"
    assert reply.body["created_at"] == timer["created_at"]
    assert api.call("GET", f"/v1/timers/{timer['id']}").body == reply.body


def test_reset_makes_paused_and_completed_timers_active_with_no_fire_counted(api: Api) -> None:
    every = api.create(schedule={"type": "every", "seconds": 60}, max_fires=2)
    fired(api, every["id"], 2)  # at 10:01 and 10:02: completed
    api.clock.advance(150_000)
    assert api.call("GET", f"/v1/timers/{every['id']}").body["status"] == "completed"
    reset = api.call("POST", f"/v1/timers/{every['id']}/reset").body
    assert (reset["status"], reset["fire_count"]) == ("active", 0)
    assert reset["next_fire_at"] == "2026-11-21T10:03:30.000Z"
    fires = api.call("GET", f"/v1/timers/{every['id']}/fires").body["items"]
    assert len(fires) == 2  # the history stays

    paused = api.create(schedule={"type": "after", "seconds": 30})
    api.call("POST", f"/v1/timers/{paused['id']}/pause")
    reset = api.call("POST", f"/v1/timers/{paused['id']}/reset").body
    assert (reset["status"], reset["next_fire_at"]) == ("active", "2026-11-21T10:03:00.000Z")


def test_a_reset_counts_max_fires_again_and_never_reuses_a_fire_id(api: Api) -> None:
    timer = api.create(schedule={"type": "every", "seconds": 60}, max_fires=3)
    fired(api, timer["id"], 2)  # 10:01, 10:02
    api.clock.now = T0 + 120_000  # the millisecond of the last fire
    reset = api.call("POST", f"/v1/timers/{timer['id']}/reset").body
    assert reset["next_fire_at"] == "2026-11-21T10:03:00.001Z"  # after the last fire
    again = stored(api, timer["id"])
    fired(api, timer["id"], 3)  # max_fires 3 from the reset on
    shown = api.call("GET", f"/v1/timers/{timer['id']}").body
    assert (shown["status"], shown["fire_count"]) == ("completed", 3)
    ids = [f["fire_id"] for f in api.call("GET", f"/v1/timers/{timer['id']}/fires").body["items"]]
    assert len(ids) == len(set(ids)) == 5
    assert again.next_fire_ms == T0 + 180_001


def test_a_reset_moves_the_timers_card_in_redis(api: Api) -> None:
    timer = api.create(schedule={"type": "after", "seconds": 30})
    assert indexed(api) == {(timer["id"], T0 + 30_000, 1)}
    api.clock.advance(20_000)
    api.call("POST", f"/v1/timers/{timer['id']}/reset")
    assert indexed(api) == {(timer["id"], T0 + 50_000, 2)}


@pytest.mark.parametrize("status", ["active", "paused"])
def test_resetting_an_at_timer_whose_time_passed_is_400_and_changes_nothing(
    api: Api, status: str
) -> None:
    timer = api.create(schedule={"type": "at", "at": "2026-11-21T10:01:00Z"})
    if status == "paused":
        timer = api.call("POST", f"/v1/timers/{timer['id']}/pause").body
    api.clock.advance(60_000)  # exactly its time: not after now
    reply = api.call("POST", f"/v1/timers/{timer['id']}/reset")
    assert (reply.status, reply.error_code) == (400, "validation_error")
    assert reply.error_fields == {"schedule.at"}
    assert api.call("GET", f"/v1/timers/{timer['id']}").body == timer


def test_a_reset_that_leaves_no_fire_is_400(api: Api) -> None:
    timer = api.create(schedule={"type": "every", "seconds": 60}, end_at="2026-11-21T10:02:30Z")
    api.clock.advance(120_000)
    reply = api.call("POST", f"/v1/timers/{timer['id']}/reset")  # 10:03 is past end_at
    assert (reply.status, reply.error_code) == (400, "validation_error")
    assert api.call("GET", f"/v1/timers/{timer['id']}").body == timer


def test_resetting_a_deleted_or_unknown_timer_is_404(api: Api) -> None:
    timer = api.create(schedule={"type": "after", "seconds": 30})
    api.call("DELETE", f"/v1/timers/{timer['id']}")
    for timer_id in (timer["id"], "tmr_nope"):
        reply = api.call("POST", f"/v1/timers/{timer_id}/reset")
        assert (reply.status, reply.error_code) == (404, "not_found")
    assert indexed(api) == set()


# ---------------------------------------------------------------- run now


def queued(api: Api, tenant: str = "acme") -> list[dict[str, Any]]:
    """The callbacks on the tenant's queue (received, then deleted)."""
    sqs = boto3.client("sqs")
    got = sqs.receive_message(
        QueueUrl=api.queues[tenant], MaxNumberOfMessages=10, MessageAttributeNames=["All"]
    ).get("Messages", [])
    for message in got:
        sqs.delete_message(QueueUrl=api.queues[tenant], ReceiptHandle=message["ReceiptHandle"])
    return [json.loads(m["Body"]) for m in got]


def test_run_now_enqueues_one_extra_fire_with_its_own_id_and_changes_nothing_else(
    api: Api,
) -> None:
    timer = api.create(schedule={"type": "every", "seconds": 60}, payload={"a": 1}, name="n")
    api.clock.advance(10_000)
    reply = api.call("POST", f"/v1/timers/{timer['id']}/run")
    assert reply.status == 202, reply.body
    fire = reply.body
    # its position: a time the reference (here the test's clock) has surely reached
    assert fire["fire_id"] == f"{timer['id']}:{T0 + 9_999}"
    assert (fire["status"], fire["scheduled_at"]) == ("enqueued", format_ms(T0 + 9_999))
    assert fire["enqueued_at"] is not None and fire["lag_ms"] >= 0
    (message,) = queued(api)
    assert message["fire_id"] == fire["fire_id"]
    assert (message["payload"], message["name"]) == ({"a": 1}, "n")
    assert message["timer_id"] == timer["id"]
    shown = api.call("GET", f"/v1/timers/{timer['id']}").body
    assert shown == timer  # next_fire_at, fire_count, updated_at: as they were
    fires = api.call("GET", f"/v1/timers/{timer['id']}/fires").body
    assert fires["items"] == [fire] and fires["next_cursor"] is None
    assert indexed(api) == {(timer["id"], T0 + 60_000, 1)}  # the schedule's card, untouched


def test_run_now_counts_toward_no_max_fires_and_runs_paused_and_completed_timers(
    api: Api,
) -> None:
    paused = api.create(schedule={"type": "every", "seconds": 60})
    api.call("POST", f"/v1/timers/{paused['id']}/pause")
    ran = api.call("POST", f"/v1/timers/{paused['id']}/run")
    assert ran.status == 202  # paused
    assert ran.body["scheduled_at"] == format_ms(T0 - 1)  # a time the reference surely reached
    assert api.call("GET", f"/v1/timers/{paused['id']}").body["status"] == "paused"
    timer = api.create(schedule={"type": "every", "seconds": 60}, max_fires=1)
    assert api.call("POST", f"/v1/timers/{timer['id']}/run").status == 202  # not counted
    fired(api, timer["id"], 1)  # its one scheduled fire: completed
    api.clock.advance(90_000)
    shown = api.call("GET", f"/v1/timers/{timer['id']}").body
    assert (shown["status"], shown["fire_count"]) == ("completed", 1)
    reply = api.call("POST", f"/v1/timers/{timer['id']}/run")  # completed: runs all the same
    assert reply.status == 202, reply.body
    assert api.call("GET", f"/v1/timers/{timer['id']}").body == shown
    fires = api.call("GET", f"/v1/timers/{timer['id']}/fires").body["items"]
    assert [f["scheduled_at"] for f in fires] == [
        format_ms(T0 + 89_999), format_ms(T0 + 60_000), format_ms(T0 - 1)
    ]  # fmt: skip
    assert len(queued(api)) == 3  # the test claimed its scheduled fire without sending it


def test_run_now_never_takes_a_fire_id_of_the_schedule_or_of_another_run(api: Api) -> None:
    timer = api.create(schedule={"type": "every", "seconds": 60})
    api.clock.now = T0 + 60_001  # surely reached: the millisecond of its next occurrence
    first = api.call("POST", f"/v1/timers/{timer['id']}/run").body
    assert first["fire_id"] == f"{timer['id']}:{T0 + 60_001}"  # a millisecond on
    assert api.clock.now >= T0 + 60_002  # waited until it was surely reached: never early
    api.clock.now = T0 + 60_002
    second = api.call("POST", f"/v1/timers/{timer['id']}/run").body
    assert second["fire_id"] == f"{timer['id']}:{T0 + 60_002}"  # that one is taken
    assert [m["fire_id"] for m in queued(api)] == [first["fire_id"], second["fire_id"]]
    fired(api, timer["id"], 1)  # the schedule's own fire at 10:01 is still its to claim
    assert api.call("GET", f"/v1/timers/{timer['id']}").body["fire_count"] == 1


def test_the_fire_history_pages_through_scheduled_and_extra_fires_newest_first(
    api: Api,
) -> None:
    timer = api.create(schedule={"type": "every", "seconds": 60})
    runs = []
    for at in (30_000, 95_000, 96_000):
        api.clock.now = T0 + at
        runs.append(api.call("POST", f"/v1/timers/{timer['id']}/run").body["fire_id"])
    fired(api, timer["id"], 3)  # 10:01, 10:02, 10:03
    every = [f"{timer['id']}:{T0 + ms}" for ms in (60_000, 120_000, 180_000)]
    want = sorted(runs + every, key=lambda f: -int(f.rsplit(":", 1)[1]))
    for limit in (1, 2, 3, 6):
        seen, cursor = [], None
        while True:
            query = {"limit": str(limit), **({"cursor": cursor} if cursor else {})}
            page = api.call("GET", f"/v1/timers/{timer['id']}/fires", query=query).body
            assert len(page["items"]) <= limit
            seen += [f["fire_id"] for f in page["items"]]
            if (cursor := page["next_cursor"]) is None:
                break
        assert seen == want, limit


def test_running_a_deleted_or_unknown_timer_is_404_and_sends_nothing(api: Api) -> None:
    timer = api.create(schedule={"type": "after", "seconds": 30})
    api.call("DELETE", f"/v1/timers/{timer['id']}")
    for timer_id in (timer["id"], "tmr_nope"):
        reply = api.call("POST", f"/v1/timers/{timer_id}/run")
        assert (reply.status, reply.error_code) == (404, "not_found")
    other = api.create(tenant="globex", schedule={"type": "after", "seconds": 30})
    reply = api.call("POST", f"/v1/timers/{other['id']}/run")  # another tenant's: 404 too
    assert (reply.status, reply.error_code) == (404, "not_found")
    assert queued(api) == [] and queued(api, "globex") == []


def test_delete_then_404_and_gone_from_redis(api: Api) -> None:
    timer = api.create(schedule={"type": "after", "seconds": 3})
    reply = api.call("DELETE", f"/v1/timers/{timer['id']}")
    assert reply.status == 204
    assert reply.body is None
    assert api.call("GET", f"/v1/timers/{timer['id']}").status == 404
    assert api.call("DELETE", f"/v1/timers/{timer['id']}").status == 404
    assert indexed(api) == set()


def test_unknown_timer_and_unknown_route_are_404(api: Api) -> None:
    assert api.call("GET", "/v1/timers/tmr_nope").error_code == "not_found"
    for tenant in ("acme", None):  # an unknown route needs no key to be told so
        for method, path in [
            ("GET", "/v1/nothing-here"),
            ("POST", "/v1/timers/a/b/c"),
            ("GET", "/v2/timers"),
            ("DELETE", "/"),
        ]:
            event = apigw.event(method, path)
            assert event["routeKey"] == "$default"  # what the HTTP API sends the catch-all
            reply = api.call(method, path, tenant=tenant)
            assert (reply.status, reply.error_code) == (404, "not_found"), (method, path)
            assert reply.body["error"]["details"] == []
            assert "allow" not in reply.headers


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("PUT", "/v1/timers", "GET, POST"),
        ("DELETE", "/v1/timers", "GET, POST"),
        ("POST", "/v1/timers/tmr_x", "GET, PATCH, DELETE"),
        ("PUT", "/v1/timers/tmr_x", "GET, PATCH, DELETE"),
        ("GET", "/v1/timers/tmr_x/pause", "POST"),
        ("GET", "/v1/timers/tmr_x/reset", "POST"),
        ("GET", "/v1/timers/tmr_x/run", "POST"),
        ("DELETE", "/v1/timers/tmr_x/fires", "GET"),
        ("POST", "/v1/tenant", "GET"),
        ("HEAD", "/v1/health", "GET"),
        ("OPTIONS", "/v1/openapi.json", "GET"),
        ("TRACE", "/v1/schedule-preview", "POST"),
        ("BREW", "/v1/timers", "GET, POST"),
    ],
)
def test_a_method_a_path_does_not_serve_is_405_with_allow(
    api: Api, method: str, path: str, allow: str
) -> None:
    for tenant in ("acme", None):  # like a 404: no key needed
        event = apigw.event(method, path)
        assert event["routeKey"] == "$default"
        reply = api.call(method, path, tenant=tenant, body=bad())
        assert (reply.status, reply.error_code) == (405, "method_not_allowed"), reply.body
        assert reply.headers["allow"] == allow
        assert reply.body["error"]["details"] == []
        assert method in reply.body["error"]["message"]
        assert allow in reply.body["error"]["message"]
    assert timer_count(api) == 0


# ---------------------------------------------------------------- tenants are walled off


@pytest.mark.parametrize(
    ("method", "suffix", "body"),
    [
        ("GET", "", None),
        ("PATCH", "", {"name": "mine now"}),
        ("DELETE", "", None),
        ("POST", "/pause", None),
        ("POST", "/resume", None),
        ("POST", "/reset", None),
        ("POST", "/run", None),
        ("GET", "/fires", None),
    ],
)
def test_another_tenants_timer_is_404_on_every_route(
    api: Api, method: str, suffix: str, body: Any
) -> None:
    theirs = api.create(tenant="acme", **bad(name="acme's"))
    reply = api.call(method, f"/v1/timers/{theirs['id']}{suffix}", tenant="globex", body=body)
    assert reply.status == 404
    assert reply.error_code == "not_found"
    assert api.call("GET", f"/v1/timers/{theirs['id']}", tenant="acme").body == theirs


def test_lists_show_only_the_callers_timers(api: Api) -> None:
    mine = api.create(tenant="acme", **bad())
    api.create(tenant="globex", **bad())
    assert [t["id"] for t in api.call("GET", "/v1/timers").body["items"]] == [mine["id"]]


# ---------------------------------------------------------------- fires


def test_fires_newest_first_with_pagination(api: Api) -> None:
    timer = api.create(schedule={"type": "every", "seconds": 60})
    fire(api.runtime.wiring.log, stored(api, timer["id"]), 3, lag_ms=40)
    first = api.call("GET", f"/v1/timers/{timer['id']}/fires", query={"limit": "2"}).body
    assert [f["scheduled_at"] for f in first["items"]] == [
        "2026-11-21T10:03:00.000Z",
        "2026-11-21T10:02:00.000Z",
    ]
    assert first["items"][0] == {
        "fire_id": f"{timer['id']}:{T0 + 180_000}",
        "scheduled_at": "2026-11-21T10:03:00.000Z",
        "enqueued_at": "2026-11-21T10:03:00.040Z",
        "lag_ms": 40,
        "status": "enqueued",
        "reason": None,
        # HTTP targets only: null for a queue target's fire
        "delivered_at": None,
        "attempts": None,
        "last_status": None,
        "last_error": None,
    }
    rest = api.call(
        "GET",
        f"/v1/timers/{timer['id']}/fires",
        query={"limit": "2", "cursor": first["next_cursor"]},
    ).body
    assert [f["scheduled_at"] for f in rest["items"]] == ["2026-11-21T10:01:00.000Z"]
    assert rest["next_cursor"] is None


# ---------------------------------------------------------------- preview


def test_schedule_preview_returns_the_cores_times_and_creates_nothing(api: Api) -> None:
    body = {
        "schedule": {"type": "cron", "expression": "30 2 * * *", "timezone": "Europe/Berlin"},
        "start_at": "2027-03-27T00:00:00Z",
        "count": 3,
    }
    reply = api.call("POST", "/v1/schedule-preview", body=body)
    assert reply.status == 200, reply.body
    # 2027-03-28 is spring-forward in Berlin: 02:30 does not exist, it fires right after the jump
    assert reply.body == {
        "fire_times": [
            "2027-03-27T01:30:00.000Z",
            "2027-03-28T01:00:00.000Z",
            "2027-03-29T00:30:00.000Z",
        ]
    }
    assert timer_count(api) == 0


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"schedule": {"type": "every", "seconds": 60}, "count": 0}, "count"),
        ({"schedule": {"type": "every", "seconds": 60}, "count": 101}, "count"),
        ({"schedule": {"type": "cron", "expression": "0 0 30 2 *"}}, "schedule"),
        # found by fuzzing: searches past the year 9999 were 500s
        (
            {"schedule": {"type": "every", "seconds": 1}, "start_at": "9999-12-31T23:59:59Z"},
            "start_at",
        ),
        (
            {
                "schedule": {"type": "cron", "expression": "0 0 29 2 *"},
                "start_at": "9998-03-01T00:00:00Z",
            },
            "schedule",
        ),
    ],
)
def test_bad_preview_is_400(api: Api, body: dict[str, Any], field: str) -> None:
    reply = api.call("POST", "/v1/schedule-preview", body=body)
    assert reply.status == 400
    assert field in reply.error_fields


def test_preview_honours_max_fires_and_end(api: Api) -> None:
    body = {"schedule": {"type": "every", "seconds": 10}, "max_fires": 2, "count": 5}
    assert len(api.call("POST", "/v1/schedule-preview", body=body).body["fire_times"]) == 2


# ---------------------------------------------------------------- rate limit


def test_tenant_over_its_rate_is_429_until_the_next_second(api: Api) -> None:
    api.tenants.set_rate_limit("acme", 3)
    replies = [api.call("GET", "/v1/tenant").status for _ in range(4)]
    assert replies == [200, 200, 200, 429]
    assert api.call("GET", "/v1/tenant", tenant="globex").status == 200  # others unaffected
    api.clock.advance(1000)
    assert api.call("GET", "/v1/tenant").status == 200


def test_rate_limited_reply_has_the_contract_body(api: Api) -> None:
    item = api.tenants.models.tenant  # a rate of 0: below what set_rate_limit takes
    item.get("TENANT#acme").update(actions=[item.rate_limit_per_s.set(0)])
    reply = api.call("GET", "/v1/tenant")
    assert reply.status == 429
    assert reply.error_code == "rate_limited"


# ---------------------------------------------------------------- events/ samples


SAMPLES = sorted(EVENTS.glob("api-*.json"))
SAMPLE_STATUS = {
    "api-console": 200, "api-console-css": 200, "api-create-cron-timer": 201,
    "api-create-key": 201, "api-create-timer": 201, "api-create-timer-batch": 201,
    "api-delete-timer": 204, "api-docs": 200, "api-docs-swagger-ui-bundle": 200,
    "api-docs-swagger-ui-css": 200, "api-get-timer": 200, "api-health": 200,
    "api-list-failed-fires": 200, "api-list-fires": 200, "api-list-keys": 200,
    "api-list-timers": 200, "api-openapi": 200, "api-patch-timer": 200, "api-pause-timer": 200,
    "api-redeliver-fire": 202, "api-redeliver-fires": 202, "api-reset-timer": 200,
    "api-resume-timer": 200, "api-revoke-key": 204, "api-run-timer": 202,
    "api-schedule-preview": 200, "api-tenant": 200, "api-usage": 200, "api-list-groups": 200,
    "api-pause-group": 200, "api-resume-group": 200, "api-delete-group": 200,
    "api-console-main-js": 200, "api-console-router-js": 200, "api-console-session-js": 200,
    "api-console-api-js": 200, "api-console-state-js": 200, "api-console-dom-js": 200,
    "api-console-format-js": 200, "api-console-timers-list-js": 200,
    "api-console-groups-js": 200, "api-console-timer-form-js": 200,
    "api-console-timer-page-js": 200, "api-console-fire-history-js": 200,
    "api-console-failed-fires-js": 200, "api-console-keys-js": 200, "api-console-usage-js": 200,
}  # fmt: skip
"""What each sample answers when replayed: a new sample names its status here."""


def test_every_route_and_function_has_a_sample_event() -> None:
    """``sam local invoke <Function> -e events/...`` has an event for every function, and the
    api one for every route of the template (its $default route answers only 404/405)."""
    stack = apigw.stack()
    routes = {route.key for route in stack.routes if not route.is_default}
    assert {json.loads(path.read_text())["routeKey"] for path in SAMPLES} == routes
    assert set(SAMPLE_STATUS) == {path.stem for path in SAMPLES}
    functions = {name.removesuffix("Function").lower() for name in stack.functions} - {"api"}
    assert functions <= {path.stem for path in EVENTS.glob("*.json")}


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.stem)
def test_sample_events_run_through_the_handler(api: Api, path: Path) -> None:
    """events/api-*.json are what `sam local invoke ApiFunction -e` sends; they must work.
    Their placeholders - ``tmr_example``, the key id ``tk_example`` - become a timer and a key
    of the tenant; a group named in the path is the group of that timer."""
    event = json.loads(path.read_text())
    if "x-api-key" in event["headers"]:
        event["headers"]["x-api-key"] = api.keys["acme"]
    if "pathParameters" in event:
        group = event["pathParameters"].get("name")
        timer = api.create(schedule={"type": "every", "seconds": 60}, group=group)
        made = {"tmr_example": timer["id"]}
        if "key_id" in event["pathParameters"]:  # a key to revoke, not the tenant's last
            made["tk_example"] = api.call("POST", "/v1/tenant/keys", body={}).body["key_id"]
        params = event["pathParameters"]
        for part, key in [(event, "rawPath"), (event["requestContext"]["http"], "path"),
                          *((params, name) for name in params)]:  # fmt: skip
            for placeholder, real in made.items():
                part[key] = part[key].replace(placeholder, real)
        if "fire_id" in params:  # a fire to redeliver
            seed_failed_fire(api, timer["id"], params["fire_id"])
        elif event["rawPath"].endswith("/fires:redeliver"):  # every failed fire of the timer
            seed_failed_fire(api, timer["id"], f"{timer['id']}:{T0 + 1000}")
    reply = api.send(event)
    assert reply.status == SAMPLE_STATUS[path.stem], (path.name, reply.body)


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.stem)
def test_sample_events_are_what_the_gateway_builds(path: Path) -> None:
    """The samples are payload format 2.0 events as the HTTP API (and the local stack's
    gateway, through the same builder) makes them for the template's route."""
    sample = json.loads(path.read_text())
    context = sample["requestContext"]
    method, raw_path = context["http"]["method"], sample["rawPath"]
    route, params = apigw.stack().route(method, raw_path) or (None, None)
    assert route is not None and not route.is_default, path.name
    body = sample.get("body")
    built = proxy_event(
        method,
        raw_path,
        route_key=route.key,
        path_params=params,
        stage=route.stage,
        headers=list(sample["headers"].items()),
        query=sample["rawQueryString"],
        body=body.encode() if body else None,
        source_ip=context["http"]["sourceIp"],
        now=context["timeEpoch"] / 1000,
    )
    built["requestContext"].update(requestId=context["requestId"], apiId=context["apiId"])
    assert sample == built
    assert sample["routeKey"] == context["routeKey"] == f"{method} {route.path}"


# ---------------------------------------------------------------- the flexible window


def test_a_window_is_stored_echoed_and_changed_by_patch(api: Api) -> None:
    timer = api.create(schedule={"type": "after", "seconds": 30}, window_seconds=60)
    assert timer["window_seconds"] == 60
    assert api.call("GET", f"/v1/timers/{timer['id']}").body["window_seconds"] == 60
    assert stored(api, timer["id"]).window_ms == 60_000
    patched = api.call("PATCH", f"/v1/timers/{timer['id']}", body={"window_seconds": 2.5})
    assert (patched.status, patched.body["window_seconds"]) == (200, 2.5)
    assert api.create(schedule={"type": "after", "seconds": 30})["window_seconds"] == 0
    batch = api.call("POST", "/v1/timers:batch", body={"timers": [
        {"schedule": {"type": "after", "seconds": 30}, "window_seconds": 900},
        {"schedule": {"type": "after", "seconds": 30}}]})  # fmt: skip
    assert [t["window_seconds"] for t in batch.body["items"]] == [900, 0]


@pytest.mark.parametrize("window", [-1, 900.5, 901, "60", None, True, [60]])
def test_a_bad_window_is_400_naming_it_and_changes_nothing(api: Api, window: Any) -> None:
    body = {"schedule": {"type": "after", "seconds": 30}, "window_seconds": window}
    reply = api.call("POST", "/v1/timers", body=body)
    assert (reply.status, reply.error_code) == (400, "validation_error")
    assert reply.error_fields == {"window_seconds"}, reply.body
    assert timer_count(api) == 0
    timer = api.create(schedule={"type": "after", "seconds": 30}, window_seconds=10)
    reply = api.call("PATCH", f"/v1/timers/{timer['id']}", body={"window_seconds": window})
    assert (reply.status, reply.error_fields) == (400, {"window_seconds"}), reply.body
    assert api.call("GET", f"/v1/timers/{timer['id']}").body == timer


def test_the_same_key_with_another_window_is_a_conflict(api: Api) -> None:
    body = {"schedule": {"type": "after", "seconds": 30}}
    headers = {"Idempotency-Key": "window-1"}
    first = api.call("POST", "/v1/timers", body=body, headers=headers)
    assert first.status == 201
    again = api.call("POST", "/v1/timers", body={**body, "window_seconds": 0}, headers=headers)
    assert (again.status, again.body["id"]) == (201, first.body["id"])  # 0 is the default
    other = api.call("POST", "/v1/timers", body={**body, "window_seconds": 60}, headers=headers)
    assert (other.status, other.error_code) == (409, "idempotency_conflict")

"""The API against a careful attacker (issue 19): nothing secret in traces or logs, input past
what JSON and the contract allow refused with the contract's 400, a list request that reads a
bounded number of items, and made-up keys refused before they cost a read of the tenants table.
Through the real handler (moto + real Redis), as test_api.py does."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import pytest

from functions.api.app import preflight, resolver
from tests.integration.api_harness import Api, make_api
from tests.support import apigw
from tests.support.clock import T0, FakeClock
from timers.api import service as service_module
from timers.core.strict_json import MAX_DEPTH
from timers.core.times import format_ms
from timers.store.timers_table import TimerStore
from timers.tenancy.auth import AUTH_CACHE_MS, CachedAuthenticator
from timers.tenancy.table import Tenant

AT = format_ms(T0 + 3_600_000)
SECRET_HEADER = "Bearer sk_live_do-not-trace-me"
SECRET_PAYLOAD = "card-4242-4242-do-not-log"


@pytest.fixture
def api(
    aws: None, clock: FakeClock, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Api]:
    yield make_api(monkeypatch, clock, redis_url)


def timers_stored(api: Api, tenant: str = "acme") -> int:
    return sum(1 for _ in api.runtime.service.timers.page(tenant, None, 1_000)[0])


# ---------------------------------------------------------------- traces and logs


class RecordingProvider:
    """Stands in for the X-Ray provider: keeps every value the tracer hands a subsegment."""

    def __init__(self) -> None:
        self.recorded: list[Any] = []

    @contextlib.contextmanager
    def in_subsegment(self, name: str, **_: Any) -> Iterator[RecordingProvider]:
        self.recorded.append(name)
        yield self

    def put_metadata(self, key: str, value: Any, namespace: str = "default") -> None:
        self.recorded.append((namespace, key, value))

    def put_annotation(self, key: str, value: Any) -> None:
        self.recorded.append((key, value))

    def text(self) -> str:
        return json.dumps(self.recorded, default=repr)


def test_traces_and_logs_keep_no_secret_or_payload(
    api: Api,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    traces = RecordingProvider()
    monkeypatch.setattr(resolver.tracer(), "provider", traces)
    secret = api.call("GET", "/v1/tenant").body["webhook_secret"]
    timer = api.create(
        schedule={"type": "at", "at": AT},
        payload={"card": SECRET_PAYLOAD},
        target={"url": "https://hooks.example.com/in", "headers": {"Authorization": SECRET_HEADER}},
    )
    api.call("GET", f"/v1/timers/{timer['id']}")
    api.call("GET", "/v1/timers")

    # An error whose message quotes the request: its message must not reach the log.
    def leak(*_: Any, **__: Any) -> Any:
        raise ValueError(f"cannot store {SECRET_PAYLOAD} with {SECRET_HEADER}")

    monkeypatch.setattr(api.runtime.service, "create", leak)
    failed = api.call("POST", "/v1/timers", body={"schedule": {"type": "at", "at": AT},
                                                  "payload": SECRET_PAYLOAD})  # fmt: skip
    assert failed.status == 500 and failed.error_code == "internal_error"

    assert "## handler" in traces.recorded  # the handler was traced
    # Every log record, with its extra keys and any exception text, as CloudWatch would get it.
    [error] = [r for r in caplog.records if r.getMessage() == "unhandled error"]
    assert error.error == "ValueError" and any("in leak" in f for f in error.trace)  # where
    logs = json.dumps([vars(r) for r in caplog.records], default=repr)
    for kept in (traces.text(), logs):
        for private in (secret, SECRET_HEADER, SECRET_PAYLOAD):
            assert private not in kept


# ---------------------------------------------------------------- JSON only JSON allows


@pytest.mark.parametrize(
    ("payload_json", "field", "says"),
    [
        ('{"x": NaN}', "body", "NaN is not JSON"),
        ('[1, Infinity]', "body", "Infinity is not JSON"),
        ('{"x": -Infinity}', "body", "-Infinity is not JSON"),
        ('{"x": 1e400}', "payload.x", "beyond the range"),
        ('{"x": "\\ud800"}', "payload.x", "lone UTF-16 surrogate"),
        ('{"\\udfff": 1}', "payload", "lone UTF-16 surrogate"),
        ("[" * 2_000 + "]" * 2_000, "body", "nested more than"),
        ("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1), "payload" + "[0]" * (MAX_DEPTH - 1),
         "nested more than"),
    ],
)  # fmt: skip
def test_a_body_json_does_not_allow_is_a_400_and_changes_nothing(
    api: Api, payload_json: str, field: str, says: str
) -> None:
    raw = f'{{"schedule": {{"type": "at", "at": "{AT}"}}, "payload": {payload_json}}}'
    for path in ("/v1/timers", "/v1/timers:batch"):
        body = raw if path == "/v1/timers" else f'{{"timers": [{raw}]}}'
        reply = api.call("POST", path, raw_body=body)
        assert reply.status == 400 and reply.error_code == "validation_error", reply.body
        [detail] = reply.body["error"]["details"]
        if path == "/v1/timers" or field == "body":
            assert detail["field"] == field, detail
        else:  # two levels deeper: the depth is the body's, its first too deep value named
            assert detail["field"].startswith(f"timers[0].{field[:7]}"), detail
        assert says in detail["message"], detail
    assert timers_stored(api) == 0


def test_nesting_up_to_the_limit_is_stored_and_read_back(api: Api) -> None:
    payload: Any = "deep"
    for _ in range(MAX_DEPTH - 2):  # the body and the payload field are two levels
        payload = [payload]
    timer = api.create(schedule={"type": "at", "at": AT}, payload=payload)
    assert api.call("GET", f"/v1/timers/{timer['id']}").body["payload"] == payload


def test_a_patch_with_nan_changes_nothing(api: Api) -> None:
    timer = api.create(schedule={"type": "at", "at": AT}, payload={"n": 1})
    reply = api.call("PATCH", f"/v1/timers/{timer['id']}", raw_body='{"payload": {"n": NaN}}')
    assert reply.status == 400 and reply.error_code == "validation_error"
    assert api.call("GET", f"/v1/timers/{timer['id']}").body["payload"] == {"n": 1}


def test_a_cron_expression_longer_than_256_characters_is_refused(api: Api) -> None:
    longest = "0 " + ",".join(str(h) for h in range(24)) + " * * *"
    assert len(longest) < 256
    api.create(schedule={"type": "cron", "expression": longest})
    padded = "0 0 * * *" + " " * 300  # whitespace a parser would skip
    reply = api.call(
        "POST", "/v1/timers", body={"schedule": {"type": "cron", "expression": padded}}
    )
    assert reply.status == 400 and reply.error_fields == {"schedule.expression"}
    preview = api.call(
        "POST", "/v1/schedule-preview", body={"schedule": {"type": "cron", "expression": padded}}
    )
    assert preview.status == 400 and preview.error_fields == {"schedule.expression"}
    assert timers_stored(api) == 1


# ---------------------------------------------------------------- a list request is bounded


def test_a_filtered_list_reads_a_bounded_number_of_items_and_hands_back_a_cursor(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(service_module, "LIST_READ_LIMIT", 12)
    monkeypatch.setattr(service_module, "LIST_READ_BATCH", 4)
    ids = [api.create(schedule={"type": "at", "at": AT})["id"] for _ in range(40)]
    active = sorted(ids)[29]  # deep in the listing, past two requests' reads
    for timer_id in ids:
        api.clock.advance(100)  # under the tenant's request rate
        if timer_id != active:
            assert api.call("POST", f"/v1/timers/{timer_id}/pause").status == 200
    reads: list[int] = []
    page = TimerStore.page

    def counted(self: TimerStore, tenant: str, after: str | None, limit: int) -> Any:
        reads[-1] += limit
        return page(self, tenant, after, limit)

    monkeypatch.setattr(TimerStore, "page", counted)
    found, cursor, pages = [], None, 0
    while True:
        reads.append(0)
        query = {"status": "active", "limit": "1", **({"cursor": cursor} if cursor else {})}
        reply = api.call("GET", "/v1/timers", query=query)
        assert reply.status == 200 and reads[-1] <= 12
        found += [t["id"] for t in reply.body["items"]]
        cursor, pages = reply.body["next_cursor"], pages + 1
        if cursor is None:
            break
    assert found == [active]
    assert pages >= 3  # the first requests came back empty, each with a cursor


def test_an_unfiltered_list_still_pages_through_everything(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(service_module, "LIST_READ_LIMIT", 12)
    ids = {api.create(schedule={"type": "at", "at": AT})["id"] for _ in range(25)}
    seen, cursor = [], None
    while True:
        query = {"limit": "10", **({"cursor": cursor} if cursor else {})}
        body = api.call("GET", "/v1/timers", query=query).body
        seen += [t["id"] for t in body["items"]]
        if (cursor := body["next_cursor"]) is None:
            break
    assert seen == sorted(ids)


# ---------------------------------------------------------------- keys


def _from(api: Api, ip: str, key: str) -> Any:
    event = apigw.event("GET", "/v1/tenant", headers={"x-api-key": key})
    event["requestContext"]["http"]["sourceIp"] = ip
    return api.send(event)


def test_made_up_keys_are_refused_before_they_cost_a_read(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    lookups: list[str | None] = []
    real = api.tenants.authenticate

    def counted(key: str | None) -> Any:
        lookups.append(key)
        return real(key)

    monkeypatch.setattr(api.runtime.authenticate, "_lookup", counted)
    answers = [_from(api, "203.0.113.9", f"tk_made-up-{n}").status for n in range(30)]
    assert answers[: preflight.KEY_LOOKUPS_PER_S] == [401] * preflight.KEY_LOOKUPS_PER_S
    assert set(answers[preflight.KEY_LOOKUPS_PER_S :]) == {429}
    assert len(lookups) == preflight.KEY_LOOKUPS_PER_S
    refused = _from(api, "203.0.113.9", "tk_made-up-again")
    assert refused.error_code == "rate_limited" and refused.headers["retry-after"] == "1"
    # Another address, and a key already known, are not held up by it.
    assert _from(api, "198.51.100.7", api.keys["acme"]).status == 200
    assert _from(api, "203.0.113.9", api.keys["acme"]).status == 200
    api.clock.advance(1_000)  # the next second's window
    assert _from(api, "203.0.113.9", "tk_made-up-later").status == 401


def test_a_flood_of_made_up_keys_does_not_push_out_known_ones() -> None:
    now = [T0]
    lookups: list[str | None] = []
    acme = Tenant(name="acme", callback_queue_url="q")

    def lookup(key: str | None) -> Tenant | None:
        lookups.append(key)
        return acme if key == "tk_good" else None

    auth = CachedAuthenticator(lambda: now[0], lookup, lambda: 0, size=5)
    assert auth("tk_good") == acme
    for n in range(100):
        assert auth(f"tk_bad-{n}") is None
    assert auth("tk_good") == acme
    assert lookups.count("tk_good") == 1  # still remembered
    assert auth("tk_bad-99") is None and lookups.count("tk_bad-99") == 1
    now[0] += AUTH_CACHE_MS
    assert auth("tk_good") == acme and lookups.count("tk_good") == 2  # until it expires

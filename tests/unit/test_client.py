"""The SDK (``timers_client``) against the OpenAPI document the API serves - every operation has
its method, and the models and request parameters use the schemas' field names, so the two
cannot drift - and its behaviour over a fake transport: 429 retries after Retry-After (on an
injected sleep), errors carrying the contract's code and details, listings that follow
next_cursor. The real thing, over HTTP, is tests/e2e/test_sdk_and_cli.py."""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from dataclasses import fields
from datetime import datetime, timedelta, timezone
from typing import Any

import httpx
import pytest

from functions.api.app import openapi, static_files
from timers_client import (
    OPERATIONS,
    ApiError,
    Client,
    FailedFire,
    Fire,
    Group,
    GroupChange,
    InvalidState,
    Key,
    NotFound,
    Preview,
    RateLimited,
    Tenant,
    Timer,
    ValidationError,
    after,
    cli,
)
from timers_client.cli import duration
from timers_client.client import PARAMETER_OF, REQUEST_FIELDS

# For people, not operations: the docs page and the console, with their assets and modules.
DOCS_PAGE = static_files.STATIC_PATHS


@pytest.fixture(scope="module")
def doc() -> dict[str, Any]:
    document: dict[str, Any] = json.loads(openapi.openapi_document())
    return document


def schema(doc: dict[str, Any], name: str) -> dict[str, Any]:
    found: dict[str, Any] = doc["components"]["schemas"][name]
    return found


def test_every_operation_of_the_document_has_an_sdk_method_and_no_other(
    doc: dict[str, Any],
) -> None:
    documented = {
        (method.upper(), path)
        for path, item in doc["paths"].items()
        for method in item
        if path not in DOCS_PAGE
    }
    assert set(OPERATIONS.values()) == documented
    for name in OPERATIONS:
        assert callable(getattr(Client, name)), name


def test_sdk_paths_parameters_match_the_document(doc: dict[str, Any]) -> None:
    for name, (method, path) in OPERATIONS.items():
        operation = doc["paths"][path][method.lower()]
        sdk = inspect.signature(getattr(Client, name)).parameters
        for param in operation.get("parameters", []):  # timer_id, status, Idempotency-Key ...
            assert param["name"].lower().replace("-", "_") in sdk, (name, param["name"])


@pytest.mark.parametrize(
    ("model", "schema_name"),
    [
        (Timer, "TimerOut"),
        (Fire, "FireOut"),
        (Tenant, "TenantOut"),
        (Preview, "PreviewOut"),
        (FailedFire, "FailedFireOut"),
        (Key, "KeyCreatedOut"),
        (Group, "GroupOut"),
        (GroupChange, "GroupChangeOut"),
    ],
)
def test_models_have_exactly_the_schemas_fields(
    doc: dict[str, Any], model: type, schema_name: str
) -> None:
    assert {f.name for f in fields(model)} == set(schema(doc, schema_name)["properties"])


def test_request_parameters_are_the_request_schemas_fields(doc: dict[str, Any]) -> None:
    for method, (schema_name, names) in REQUEST_FIELDS.items():
        assert set(names) == set(schema(doc, schema_name)["properties"]), method
        parameters = {PARAMETER_OF.get(name, name) for name in names}
        assert parameters <= set(inspect.signature(getattr(Client, method)).parameters), method
    batch = schema(doc, "TimerBatchIn")["properties"]["timers"]["items"]["$ref"]
    assert batch.endswith("/TimerCreate")


def test_listing_schemas_are_items_and_next_cursor(doc: dict[str, Any]) -> None:
    for name in ("TimerList", "FireList", "FailedFireList", "GroupList"):
        assert set(schema(doc, name)["properties"]) == {"items", "next_cursor"}


# ---------------------------------------------------------------- over a fake transport

TIMER = {
    "id": "tmr_1", "name": None, "schedule": {"type": "after", "seconds": 30.0},
    "start_at": None, "end_at": None, "max_fires": None,
    "target": {"queue_url": "http://q"}, "payload": {"a": 1}, "misfire": "fire_once",
    "status": "active", "next_fire_at": "2026-11-21T10:00:30.000Z", "fire_count": 0,
    "created_at": "2026-11-21T10:00:00.000Z", "updated_at": "2026-11-21T10:00:00.000Z",
    "expires_at": None,
}  # fmt: skip

Handler = Callable[[httpx.Request], httpx.Response]


def client(handler: Handler, sleeps: list[float] | None = None, **options: Any) -> Client:
    record = sleeps if sleeps is not None else []
    return Client("http://api/v1", "tk_x", transport=httpx.MockTransport(handler),
                  sleep=record.append, **options)  # fmt: skip


def error(status: int, code: str, *details: tuple[str, str], **headers: str) -> httpx.Response:
    body = {"error": {"code": code, "message": f"{code} happened",
                      "details": [{"field": f, "message": m} for f, m in details]}}  # fmt: skip
    return httpx.Response(status, json=body, headers=headers)


def test_create_sends_the_key_json_and_idempotency_key_and_returns_a_timer() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(201, json=TIMER)

    timer = client(handler).create(after(30), payload={"a": 1}, idempotency_key="k1")
    assert timer == Timer(**TIMER)
    [request] = seen
    assert (request.method, request.url.path) == ("POST", "/v1/timers")
    assert request.headers["x-api-key"] == "tk_x"
    assert request.headers["idempotency-key"] == "k1"
    assert request.headers["content-type"] == "application/json"
    assert json.loads(request.content) == {"schedule": after(30), "payload": {"a": 1}}


def test_a_429_is_retried_after_its_retry_after() -> None:
    answers = [error(429, "rate_limited", **{"Retry-After": "2"}), httpx.Response(200, json=TIMER)]
    sleeps: list[float] = []
    timer = client(lambda _: answers.pop(0), sleeps).get("tmr_1")
    assert timer.id == "tmr_1"
    assert sleeps == [2.0]


def test_429s_beyond_max_retries_raise_rate_limited_with_when_to_retry() -> None:
    sleeps: list[float] = []
    sdk = client(
        lambda _: error(429, "rate_limited", **{"Retry-After": "1"}), sleeps, max_retries=2
    )
    with pytest.raises(RateLimited) as raised:
        sdk.get("tmr_1")
    assert sleeps == [1.0, 1.0]
    assert (raised.value.status, raised.value.code, raised.value.retry_after_s) == (
        429, "rate_limited", 1.0,
    )  # fmt: skip


def test_the_gateways_own_429_without_retry_after_backs_off_exponentially() -> None:
    sleeps: list[float] = []
    sdk = client(lambda _: httpx.Response(429, json={"message": "Too Many Requests"}), sleeps)
    with pytest.raises(RateLimited) as raised:
        sdk.tenant()
    assert sleeps == [0.5, 1.0, 2.0]
    assert (raised.value.code, raised.value.message) == ("http_429", "Too Many Requests")


def test_errors_carry_the_contracts_code_and_details() -> None:
    sdk = client(lambda _: error(400, "validation_error", ("schedule.seconds", "must be >= 1")))
    with pytest.raises(ValidationError) as raised:
        sdk.create({"type": "every", "seconds": 0})
    assert raised.value.code == "validation_error"
    assert raised.value.fields == {"schedule.seconds"}
    assert "schedule.seconds: must be >= 1" in str(raised.value)
    with pytest.raises(NotFound):
        client(lambda _: error(404, "not_found")).delete("tmr_nope")
    with pytest.raises(InvalidState) as state:
        client(lambda _: error(409, "invalid_state")).pause("tmr_1")
    assert isinstance(state.value, ApiError) and state.value.status == 409


def test_list_follows_next_cursor_across_pages() -> None:
    pages = {
        None: {"items": [TIMER, {**TIMER, "id": "tmr_2"}], "next_cursor": "c1"},
        "c1": {"items": [{**TIMER, "id": "tmr_3"}], "next_cursor": None},
    }
    queries: list[dict[str, str]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        queries.append(dict(request.url.params))
        return httpx.Response(200, json=pages[request.url.params.get("cursor")])

    ids = [t.id for t in client(handler).list(status="active", page_size=2)]
    assert ids == ["tmr_1", "tmr_2", "tmr_3"]
    assert queries == [{"status": "active", "limit": "2"},
                       {"status": "active", "limit": "2", "cursor": "c1"}]  # fmt: skip


def test_patch_sends_only_what_is_given_and_none_clears() -> None:
    bodies: list[Any] = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return httpx.Response(200, json=TIMER)

    client(handler).patch("tmr_1", name=None, max_fires=3)
    assert bodies == [{"name": None, "max_fires": 3}]


def test_a_delete_is_204_with_no_body() -> None:
    assert client(lambda _: httpx.Response(204)).delete("tmr_1") is None


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30", 30), ("30s", 30), ("1.5s", 1.5), ("250ms", 0.25), ("5m", 300), ("1h30m", 5400),
     ("2d", 172_800)],
)  # fmt: skip
def test_cli_durations(text: str, seconds: float) -> None:
    assert duration(text) == seconds


@pytest.mark.parametrize("text", ["", "5 minutes", "s", "5x", "1h-5m"])
def test_cli_rejects_what_is_not_a_duration(text: str) -> None:
    with pytest.raises(Exception, match="not a duration"):
        duration(text)


# ---------------------------------------------------------------- failed fires

FAILED = {
    "fire_id": "tmr_1:1795255201000", "timer_id": "tmr_1", "name": "invoice",
    "due_at": "2026-11-21T10:00:01.000Z", "failed_at": "2026-11-21T10:00:02.000Z",
    "reason": "http 400", "last_status": 400, "attempts": 1, "redelivered_at": None,
}  # fmt: skip


def test_failed_fires_follow_next_cursor_within_their_window() -> None:
    pages = {
        None: {"items": [FAILED], "next_cursor": "c1"},
        "c1": {"items": [{**FAILED, "fire_id": "tmr_1:1795255200000"}], "next_cursor": None},
    }
    queries: list[dict[str, str]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        assert (request.method, request.url.path) == ("GET", "/v1/fires")
        queries.append(dict(request.url.params))
        return httpx.Response(200, json=pages[request.url.params.get("cursor")])

    since = datetime(2026, 11, 21, 11, tzinfo=timezone(timedelta(hours=1)))
    fires = list(client(handler).failed_fires(since=since, until="2026-11-22T00:00:00Z"))
    assert fires == [FailedFire(**FAILED), FailedFire(**pages["c1"]["items"][0])]
    window = {"status": "failed", "since": "2026-11-21T11:00:00+01:00",
              "until": "2026-11-22T00:00:00Z", "limit": "50"}  # fmt: skip
    assert queries == [window, {**window, "cursor": "c1"}]


def test_redeliver_posts_to_the_fire_and_redeliver_all_to_the_timer() -> None:
    seen: list[tuple[str, bytes]] = []
    redelivered = {**FAILED, "redelivered_at": "2026-11-21T10:05:00.000Z"}

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.method, request.url.raw_path))
        if request.url.path.endswith("fires:redeliver"):
            return httpx.Response(202, json={"items": [redelivered]})
        return httpx.Response(202, json=redelivered)

    sdk = client(handler)
    assert sdk.redeliver("tmr_1", "tmr_1:1795255201000") == FailedFire(**redelivered)
    assert sdk.redeliver_all("tmr_1") == [FailedFire(**redelivered)]
    assert seen == [
        ("POST", b"/v1/timers/tmr_1/fires/tmr_1:1795255201000/redeliver"),
        ("POST", b"/v1/timers/tmr_1/fires:redeliver"),
    ]
    with pytest.raises(InvalidState):
        client(lambda _: error(409, "invalid_state")).redeliver("tmr_1", "tmr_1:1")


def run_cli(
    monkeypatch: pytest.MonkeyPatch, handler: Handler, *argv: str
) -> tuple[int, list[httpx.Request]]:
    """``timers ARGV`` over the fake transport; the requests it made."""
    seen: list[httpx.Request] = []

    def record(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return handler(request)

    monkeypatch.setattr(cli, "Client", lambda api, key: client(record))
    return cli.main(["--api", "http://api/v1", "--api-key", "tk_x", *argv]), seen


def test_cli_failed_prints_a_table_or_json_with_the_window(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"items": [FAILED], "next_cursor": None})

    code, seen = run_cli(monkeypatch, handler, "failed", "--since", "2026-11-21T00:00:00Z")
    assert code == 0
    assert dict(seen[0].url.params) == {
        "status": "failed", "since": "2026-11-21T00:00:00Z", "limit": "50"
    }  # fmt: skip
    header, row = capsys.readouterr().out.splitlines()
    assert header == "FAILED AT                 FIRE ID              ATTEMPTS  LAST STATUS  REASON"
    assert row.split() == ["2026-11-21T10:00:02.000Z", "tmr_1:1795255201000",
                           str(FAILED["attempts"]), "400", "http", "400"]  # fmt: skip
    code, _ = run_cli(monkeypatch, handler, "failed", "--until", "2026-11-22T00:00:00Z", "--json")
    assert code == 0
    assert json.loads(capsys.readouterr().out) == {"items": [FAILED]}


def test_cli_redeliver_one_fire_or_all_of_a_timers(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("fires:redeliver"):
            return httpx.Response(202, json={"items": [FAILED, {**FAILED, "fire_id": "tmr_1:2"}]})
        return httpx.Response(202, json=FAILED)

    code, seen = run_cli(monkeypatch, handler, "redeliver", "tmr_1", "tmr_1:1795255201000")
    assert (code, capsys.readouterr().out) == (0, "redelivered tmr_1:1795255201000\n")
    assert seen[0].url.raw_path == b"/v1/timers/tmr_1/fires/tmr_1:1795255201000/redeliver"
    code, seen = run_cli(monkeypatch, handler, "--json", "redeliver", "tmr_1")
    assert code == 0 and seen[0].url.raw_path == b"/v1/timers/tmr_1/fires:redeliver"
    assert [f["fire_id"] for f in json.loads(capsys.readouterr().out)["items"]] == [
        "tmr_1:1795255201000",
        "tmr_1:2",
    ]
    code, _ = run_cli(monkeypatch, lambda _: error(409, "invalid_state"), "redeliver", "t", "t:1")
    assert code == 1 and "invalid_state" in capsys.readouterr().err


def test_a_group_operation_calls_until_done_and_reports_each_step() -> None:
    answers = iter([(3, False), (2, False), (0, True)])
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        changed, done = next(answers)
        action = "delete" if request.method == "DELETE" else "pause"
        body = {"group": "order-7", "action": action, "changed": changed, "done": done}
        return httpx.Response(200, json=body)

    steps: list[GroupChange] = []
    total = client(handler).pause_group("order-7", on_step=steps.append)
    assert total == GroupChange("order-7", "pause", 5, True)
    assert [s.changed for s in steps] == [3, 2, 0]
    assert {(r.method, r.url.path) for r in seen} == {("POST", "/v1/groups/order-7/pause")}


def test_groups_and_the_group_filter() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/groups":
            item = {"name": "a", "created_at": "2026-11-21T10:00:00.000Z"}
            return httpx.Response(200, json={"items": [item], "next_cursor": None})
        assert request.url.params["group"] == "a"
        return httpx.Response(200, json={"items": [{**TIMER, "group": "a"}], "next_cursor": None})

    sdk = client(handler)
    assert list(sdk.groups()) == [Group("a", "2026-11-21T10:00:00.000Z")]
    assert [t.group for t in sdk.list(group="a")] == ["a"]


def test_a_group_step_that_failed_on_the_server_is_made_again() -> None:
    answers = iter([error(500, "internal_error"), error(503, "unavailable"),
                    httpx.Response(200, json={"group": "g", "action": "delete", "changed": 4,
                                              "done": True})])  # fmt: skip
    sleeps: list[float] = []
    total = client(lambda request: next(answers), sleeps).delete_group("g")
    assert (total.changed, total.done, sleeps) == (4, True, [1.0, 2.0])
    refused = iter([error(404, "not_found")])
    with pytest.raises(NotFound):
        client(lambda request: next(refused)).delete_group("g")

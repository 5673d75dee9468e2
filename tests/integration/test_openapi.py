"""The OpenAPI document: valid 3.1, every answer of every operation declared with its schema,
nothing the API never sends (the framework's 422), and real answers that conform to it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest
from openapi_spec_validator import validate
from openapi_spec_validator.validation import OpenAPIV31SpecValidator

from tests.integration.api_harness import Api, make_api, seed_failed_fire
from tests.support.clock import FakeClock

HTTP_METHODS = {"get", "put", "post", "delete", "options", "head", "patch", "trace"}


@pytest.fixture
def api(
    aws: None, clock: FakeClock, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Api]:
    yield make_api(monkeypatch, clock, redis_url)


@pytest.fixture
def doc(api: Api) -> dict[str, Any]:
    reply = api.call("GET", "/v1/openapi.json", tenant=None)
    assert reply.status == 200
    return dict(reply.body)


def operations(doc: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, item in doc["paths"].items():
        for method, operation in item.items():
            if method in HTTP_METHODS:
                yield method.upper(), path, operation


def conforms(doc: dict[str, Any], method: str, path: str, status: int, body: Any) -> None:
    """``body`` is valid against the schema the document declares for this answer."""
    response = doc["paths"][path][method.lower()]["responses"][str(status)]
    schema = response["content"]["application/json"]["schema"]
    resolver_doc = {**schema, "components": doc["components"]}
    jsonschema.validate(body, resolver_doc, cls=jsonschema.Draft202012Validator)


def test_the_document_is_valid_openapi_3_1(doc: dict[str, Any]) -> None:
    assert doc["openapi"] == "3.1.0"
    validate(doc, cls=OpenAPIV31SpecValidator)


def test_operations_are_grouped_by_resource_and_static_files_are_not_operations(
    doc: dict[str, Any],
) -> None:
    """The docs page groups operations by tag: one per resource, never powertools' "default";
    the docs page and the console are files for people, not operations of the API."""
    resources = {"timers", "groups", "fires", "schedules", "tenant", "service"}
    assert [tag["name"] for tag in doc["tags"]] == ["timers", "groups", "fires", "schedules",
                                                   "tenant", "service"]  # fmt: skip
    tagged = {(method, path): operation["tags"] for method, path, operation in operations(doc)}
    assert all(len(tags) == 1 and tags[0] in resources for tags in tagged.values()), tagged
    assert tagged[("POST", "/v1/timers")] == ["timers"]
    assert tagged[("GET", "/v1/fires")] == ["fires"]
    assert tagged[("DELETE", "/v1/groups/{name}")] == ["groups"]
    assert tagged[("POST", "/v1/schedule-preview")] == ["schedules"]
    assert tagged[("GET", "/v1/health")] == ["service"]
    assert not [path for path in doc["paths"] if path.startswith(("/v1/docs", "/v1/console"))]


def test_every_operation_declares_its_success_with_a_schema_and_no_422(
    doc: dict[str, Any],
) -> None:
    for method, path, operation in operations(doc):
        responses = operation["responses"]
        assert "422" not in responses, (method, path)  # the API answers 400, never 422
        success = [s for s in responses if s.startswith("2")]
        assert len(success) == 1, (method, path, success)
        if success == ["204"]:
            assert "content" not in responses["204"], (method, path)
            continue
        [(media, content)] = responses[success[0]]["content"].items()
        assert content["schema"], (method, path, media)
    schemas = doc["components"]["schemas"]
    assert not {"HTTPValidationError", "ValidationError", "ResponseValidationError"} & set(schemas)


def test_successes_are_the_contracts(doc: dict[str, Any]) -> None:
    ref = "#/components/schemas/"

    def schema(method: str, path: str, status: str) -> Any:
        responses = doc["paths"][path][method]["responses"]
        return responses[status]["content"]["application/json"]["schema"]["$ref"][len(ref) :]

    assert schema("post", "/v1/timers", "201") == "TimerOut"
    assert schema("post", "/v1/timers:batch", "201") == "TimerBatchOut"
    assert schema("get", "/v1/timers", "200") == "TimerList"
    for method, path in [
        ("get", "/v1/timers/{timer_id}"),
        ("patch", "/v1/timers/{timer_id}"),
        ("post", "/v1/timers/{timer_id}/pause"),
        ("post", "/v1/timers/{timer_id}/resume"),
        ("post", "/v1/timers/{timer_id}/reset"),
    ]:
        assert schema(method, path, "200") == "TimerOut"
    assert schema("get", "/v1/timers/{timer_id}/fires", "200") == "FireList"
    assert schema("post", "/v1/timers/{timer_id}/run", "202") == "FireOut"
    assert schema("get", "/v1/tenant/keys", "200") == "KeyList"
    assert schema("post", "/v1/tenant/keys", "201") == "KeyCreatedOut"
    assert set(doc["paths"]["/v1/tenant/keys/{key_id}"]["delete"]["responses"]) >= {
        "204", "404", "409"
    }  # fmt: skip
    assert schema("get", "/v1/tenant/usage", "200") == "UsageOut"
    usage = doc["components"]["schemas"]["UsageOut"]
    assert set(usage["required"]) == set(usage["properties"]) >= {"fires", "lag"}
    assert usage["properties"]["lag"]["$ref"] == "#/components/schemas/LagCountsOut"
    lag = doc["components"]["schemas"]["LagCountsOut"]  # the contract's names, in its order
    assert lag["additionalProperties"] is False
    assert list(lag["properties"]) == lag["required"] == [
        "ontime", "1-200ms", "200-600ms", "600-1000ms", "1000-2000ms", "over_2000ms"
    ]  # fmt: skip
    assert schema("post", "/v1/schedule-preview", "200") == "PreviewOut"
    assert schema("get", "/v1/tenant", "200") == "TenantOut"
    assert schema("get", "/v1/health", "200") == "HealthOut"
    assert schema("get", "/v1/fires", "200") == "FailedFireList"
    redeliver = "/v1/timers/{timer_id}/fires/{fire_id}/redeliver"
    assert schema("post", redeliver, "202") == "FailedFireOut"
    assert schema("post", "/v1/timers/{timer_id}/fires:redeliver", "202") == "FailedFireBatchOut"
    failed = doc["components"]["schemas"]["FailedFireOut"]
    assert failed["additionalProperties"] is False
    assert set(failed["required"]) == set(failed["properties"]) == {
        "fire_id", "timer_id", "name", "due_at", "failed_at", "reason", "last_status",
        "attempts", "redelivered_at",
    }  # fmt: skip
    assert set(doc["paths"]["/v1/timers/{timer_id}"]["delete"]["responses"]) >= {"204"}
    timer = doc["components"]["schemas"]["TimerOut"]
    assert timer["additionalProperties"] is False
    assert set(timer["required"]) == set(timer["properties"])  # every field, always


def test_every_error_is_the_contracts_body_and_429_says_when_to_retry(
    doc: dict[str, Any],
) -> None:
    for method, path, operation in operations(doc):
        for status, response in operation["responses"].items():
            if int(status) < 400:
                continue
            assert response["content"]["application/json"]["schema"] == {
                "$ref": "#/components/schemas/ErrorOut"
            }, (method, path, status)
        keyed = operation.get("security") != []
        assert ("429" in operation["responses"]) == keyed, (method, path)
        if keyed:
            header = operation["responses"]["429"]["headers"]["Retry-After"]
            assert header["schema"] == {"type": "integer", "minimum": 1}


def test_a_rate_limited_answer_carries_retry_after(api: Api, doc: dict[str, Any]) -> None:
    item = api.tenants.models.tenant  # a rate of 0: below what set_rate_limit takes
    item.get("TENANT#acme").update(actions=[item.rate_limit_per_s.set(0)])
    reply = api.call("GET", "/v1/tenant")
    assert (reply.status, reply.error_code) == (429, "rate_limited")
    assert reply.headers["retry-after"] == "1"
    conforms(doc, "GET", "/v1/tenant", 429, reply.body)


def test_real_answers_conform_to_the_declared_schemas(api: Api, doc: dict[str, Any]) -> None:
    every = {"schedule": {"type": "every", "seconds": 5}, "payload": {"a": 1}, "name": "n"}
    created = api.call("POST", "/v1/timers", body=every)
    conforms(doc, "POST", "/v1/timers", 201, created.body)
    timer_id = created.body["id"]
    batch = api.call(
        "POST",
        "/v1/timers:batch",
        body={
            "timers": [
                {"schedule": {"type": "at", "at": "2030-01-01T00:00:00Z"}},
                {"schedule": {"type": "cron", "expression": "0 7 * * 1-5"}},
                {"schedule": {"type": "after", "seconds": 0.5}, "max_fires": 1},
            ]
        },
    )
    conforms(doc, "POST", "/v1/timers:batch", 201, batch.body)
    answers = [
        ("GET", "/v1/timers", "/v1/timers", 200),
        ("GET", f"/v1/timers/{timer_id}", "/v1/timers/{timer_id}", 200),
        ("POST", f"/v1/timers/{timer_id}/pause", "/v1/timers/{timer_id}/pause", 200),
        ("POST", f"/v1/timers/{timer_id}/resume", "/v1/timers/{timer_id}/resume", 200),
        ("POST", f"/v1/timers/{timer_id}/reset", "/v1/timers/{timer_id}/reset", 200),
        ("POST", "/v1/timers/tmr_nope/reset", "/v1/timers/{timer_id}/reset", 404),
        ("POST", f"/v1/timers/{timer_id}/run", "/v1/timers/{timer_id}/run", 202),
        ("POST", "/v1/timers/tmr_nope/run", "/v1/timers/{timer_id}/run", 404),
        ("GET", "/v1/tenant/keys", "/v1/tenant/keys", 200),
        ("DELETE", "/v1/tenant/keys/tk_nope", "/v1/tenant/keys/{key_id}", 404),
        ("GET", "/v1/tenant/usage", "/v1/tenant/usage", 200),
        ("GET", f"/v1/timers/{timer_id}/fires", "/v1/timers/{timer_id}/fires", 200),
        ("GET", "/v1/tenant", "/v1/tenant", 200),
        ("GET", "/v1/health", "/v1/health", 200),
        ("GET", "/v1/timers/tmr_nope", "/v1/timers/{timer_id}", 404),
        ("PUT", "/v1/timers", None, 405),
    ]
    for method, path, documented, status in answers:
        reply = api.call(method, path)
        assert reply.status == status, (method, path, reply.body)
        if documented is not None:
            conforms(doc, method, documented, status, reply.body)
        else:
            conforms(doc, "GET", "/v1/timers", 405, reply.body)
    patched = api.call("PATCH", f"/v1/timers/{timer_id}", body={"name": None})
    conforms(doc, "PATCH", "/v1/timers/{timer_id}", 200, patched.body)
    preview = api.call("POST", "/v1/schedule-preview", body={"schedule": every["schedule"]})
    conforms(doc, "POST", "/v1/schedule-preview", 200, preview.body)
    bad = api.call("POST", "/v1/timers", body={"schedule": {"type": "every", "seconds": 0}})
    conforms(doc, "POST", "/v1/timers", 400, bad.body)
    gone = api.call("DELETE", f"/v1/timers/{timer_id}")
    assert (gone.status, gone.body) == (204, None)


def test_failed_fire_answers_conform_to_the_declared_schemas(api: Api, doc: dict[str, Any]) -> None:
    timer_id = api.create(schedule={"type": "every", "seconds": 60})["id"]
    fire_id = f"{timer_id}:1795255201000"
    seed_failed_fire(api, timer_id, fire_id)
    one = "/v1/timers/{timer_id}/fires/{fire_id}/redeliver"
    every = "/v1/timers/{timer_id}/fires:redeliver"
    listed = api.call("GET", "/v1/fires", query={"status": "failed"})
    assert listed.status == 200 and len(listed.body["items"]) == 1
    conforms(doc, "GET", "/v1/fires", 200, listed.body)
    answers = [
        ("GET", "/v1/fires", "/v1/fires", 400),  # no status
        ("POST", f"/v1/timers/{timer_id}/fires/{fire_id}/redeliver", one, 202),
        ("POST", f"/v1/timers/{timer_id}/fires/{fire_id}/redeliver", one, 409),
        ("POST", f"/v1/timers/{timer_id}/fires/{timer_id}:1/redeliver", one, 404),
        ("POST", f"/v1/timers/{timer_id}/fires:redeliver", every, 202),
        ("POST", "/v1/timers/tmr_nope/fires:redeliver", every, 404),
    ]
    for method, path, documented, status in answers:
        reply = api.call(method, path)
        assert reply.status == status, (method, path, reply.body)
        conforms(doc, method, documented, status, reply.body)


def test_an_idempotency_key_is_a_declared_bounded_header(api: Api, doc: dict[str, Any]) -> None:
    [param] = doc["paths"]["/v1/timers"]["post"]["parameters"]
    assert (param["in"], param["name"].lower()) == ("header", "idempotency-key")
    assert param["schema"]["anyOf"][0]["maxLength"] == 256
    body = {"schedule": {"type": "after", "seconds": 60}}
    reply = api.call("POST", "/v1/timers", body=body, headers={"Idempotency-Key": "k" * 257})
    assert (reply.status, reply.error_code) == (400, "validation_error")
    assert reply.error_fields == {"idempotency-key"}  # header names: lower case
    assert api.call("GET", "/v1/timers").body["items"] == []


def test_the_route_table_agrees_with_the_document(doc: dict[str, Any]) -> None:
    """The preflight's table (methods per path, which take a body, which need no key) is read
    from the resolver's routes, not from the document (a cold start's first request would
    generate it): both say the same of every operation."""
    from functions.api.app import routing
    from functions.api.app.openapi import PUBLIC_PATHS

    for path, item in doc["paths"].items():
        concrete = path.replace("{", "x").replace("}", "")  # one segment per parameter
        table = routing.route_methods(concrete)
        methods = {m: operation for m, operation in item.items() if m in HTTP_METHODS}
        assert set(table) == {method.upper() for method in methods}, path
        for method, operation in methods.items():
            expected = routing.Operation("requestBody" in operation, path in PUBLIC_PATHS)
            assert table[method.upper()] == expected, (method, path)


def test_the_group_routes_and_answers_are_documented(doc: dict[str, Any]) -> None:
    paths = doc["paths"]
    for method, path in [("post", "/v1/groups/{name}/pause"), ("post", "/v1/groups/{name}/resume"),
                         ("delete", "/v1/groups/{name}")]:  # fmt: skip
        responses = paths[path][method]["responses"]
        assert set(responses) >= {"200", "400", "401", "404", "405", "429"}, (method, path)
        ok = responses["200"]["content"]["application/json"]["schema"]
        assert ok == {"$ref": "#/components/schemas/GroupChangeOut"}
    listing = paths["/v1/groups"]["get"]["responses"]["200"]["content"]["application/json"]
    assert listing["schema"] == {"$ref": "#/components/schemas/GroupList"}
    schemas = doc["components"]["schemas"]
    assert set(schemas["GroupChangeOut"]["properties"]) == {"group", "action", "changed", "done"}
    assert set(schemas["GroupOut"]["properties"]) == {"name", "created_at"}
    assert "group" in schemas["TimerOut"]["required"]
    for body in ("TimerCreate", "TimerPatch"):
        assert "group" in schemas[body]["properties"], body
    listing_params = {p["name"] for p in paths["/v1/timers"]["get"]["parameters"]}
    assert {"group", "status", "limit", "cursor"} <= listing_params

"""The local stack's pure parts: reading template.yaml, schedules, the HTTP API's mapping."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from ops.local import apigw
from ops.local.schedules import Scheduler, next_run, scheduled_event
from ops.local.spec import Resolver, ScheduleSpec, TemplateError, load_stack
from ops.template import Tag

LOCAL = {"REDIS_URL": "redis://127.0.0.1:1/0", "REDIS_CLUSTER": "false"}
T = datetime(2026, 11, 21, 10, 0, 30, tzinfo=UTC).timestamp()  # a Saturday


def test_every_template_function_runs_with_its_handler_code_and_environment() -> None:
    stack = load_stack(LOCAL)
    assert set(stack.functions) == {
        "ApiFunction",
        "MigratorFunction",
        "FanoutFunction",
        "TriggerFunction",
        "DeliveryFunction",
    }
    fanout = stack.functions["FanoutFunction"]
    assert (fanout.module, fanout.attr) == ("app", "handler")
    assert fanout.code_paths[0].endswith("functions/fanout")
    assert fanout.code_paths[1].endswith("layers/shared")  # the shared layer, via Globals
    assert fanout.environment["TRIGGER_FUNCTION_NAME"] == "TriggerFunction"
    assert fanout.environment["TIMERS_TABLE"] == "TimersTable"
    assert fanout.environment["TENANT_QUEUE_PREFIX"] == "timers-tenant-"  # ${AWS::StackName}
    assert fanout.environment["BUCKET_COUNT"] == "16"  # samconfig.toml's overrides
    assert fanout.environment["REDIS_URL"] == LOCAL["REDIS_URL"]  # the local stand-in wins
    assert (fanout.timeout_s, fanout.memory_mb, fanout.async_retries) == (75.0, 256, 0)
    assert stack.functions["ApiFunction"].memory_mb == 512  # its own, over the Globals


def test_the_local_account_reserves_no_more_than_its_sandboxes() -> None:
    """A function's ReservedConcurrentExecutions is its cap of sandboxes; the local account has
    LOCAL_LAMBDA_CONCURRENCY per function, so a reservation above it is taken as it - and so is
    the parameter it comes from, which the fan-out is told (its budget of trigger runs)."""
    deployed = load_stack(LOCAL)
    assert deployed.functions["TriggerFunction"].reserved == 128
    assert deployed.functions["FanoutFunction"].environment["TRIGGER_CONCURRENCY"] == "128"
    local = load_stack(LOCAL, concurrency=8)
    assert local.functions["TriggerFunction"].reserved == 8
    assert local.functions["FanoutFunction"].environment["TRIGGER_CONCURRENCY"] == "8"
    assert local.functions["FanoutFunction"].reserved == 3  # under the cap: its own
    assert local.functions["ApiFunction"].reserved == 8


def test_http_api_routes_and_schedules_come_from_the_events() -> None:
    stack = load_stack(LOCAL)
    route, params = stack.route("POST", "/v1/timers/tmr_1/pause") or (None, None)
    assert route is not None and (route.path, route.stage) == ("/v1/timers/{id}/pause", "$default")
    assert (route.key, route.function, params) == (
        "POST /v1/timers/{id}/pause",
        "ApiFunction",
        {"id": "tmr_1"},
    )
    # Every other method and path reaches the api function's $default route.
    for method, path in [("PUT", "/v1/timers"), ("GET", "/v1/timers/a/b"), ("TRACE", "/")]:
        route, params = stack.route(method, path) or (None, None)
        assert route is not None and (route.key, route.function) == ("$default", "ApiFunction")
        assert params == {}
    assert stack.routes[-1].is_default  # tried last
    assert {(s.function, s.expression) for s in stack.schedules} == {
        ("MigratorFunction", "rate(1 minute)"),
        ("FanoutFunction", "rate(1 minute)"),
    }


def test_an_endpoint_the_stack_cannot_provide_is_a_clear_error() -> None:
    with pytest.raises(TemplateError, match=r"REDIS_URL.*TimersCache\.Endpoint\.Address"):
        load_stack({})


def test_intrinsics_resolve_to_local_names() -> None:
    doc = {
        "Parameters": {"Size": {"Default": 3}},
        "Resources": {
            "Q": {"Type": "AWS::SQS::Queue", "Properties": {}},
            "F": {"Type": "AWS::Serverless::Function"},
        },
    }
    resolve = Resolver(doc, "stk", "eu-west-1", {"Size": "7"}, "http://127.0.0.1:9")
    assert resolve(Tag("Ref", "Size")) == "7"
    assert resolve(Tag("Ref", "Q")) == "http://127.0.0.1:9/123456789012/Q"
    assert resolve(Tag("GetAtt", "Q.Arn")) == "arn:aws:sqs:eu-west-1:123456789012:Q"
    assert (
        resolve(Tag("GetAtt", ["F", "Arn"])) == "arn:aws:lambda:eu-west-1:123456789012:function:F"
    )
    assert resolve(Tag("Sub", "${AWS::StackName}-${Size}-${!Literal}")) == "stk-7-${Literal}"
    assert resolve(Tag("Join", [",", ["a", Tag("Ref", "AWS::Region")]])) == "a,eu-west-1"
    with pytest.raises(TemplateError, match="!Ref Nope"):
        resolve(Tag("Ref", "Nope"))
    with pytest.raises(TemplateError, match="FindInMap"):
        resolve(Tag("FindInMap", ["M", "a", "b"]))


@pytest.mark.parametrize(
    ("expression", "first", "then"),
    [
        ("rate(1 minute)", T, T + 60),
        ("rate(5 minutes)", T, T + 300),
        ("rate(2 hours)", T, T + 7200),
        # EventBridge cron: six fields, ? for "any", 1-7 = SUN-SAT.
        ("cron(0 12 * * ? *)", T + 2 * 3600 - 30, T + 2 * 3600 - 30),
        ("cron(15 10 ? * 7 *)", T + 14 * 60 + 30, T + 14 * 60 + 30),  # Saturday = 7
    ],
)
def test_schedule_expressions(expression: str, first: float, then: float) -> None:
    assert next_run(expression, T, first=True) == first
    assert next_run(expression, T) == then


@pytest.mark.parametrize("bad", ["rate(0.5 minutes)", "every minute", "cron(* * * * *)"])
def test_a_bad_schedule_expression_is_a_template_error(bad: str) -> None:
    with pytest.raises(TemplateError):
        next_run(bad, T)


def test_rate_schedules_run_at_start_then_every_period_without_backfill() -> None:
    now = [T]
    fired: list[tuple[str, float]] = []
    schedule = ScheduleSpec("F", "F.Schedule", "rate(1 minute)", None)
    scheduler = Scheduler([schedule], lambda s, at: fired.append((s.name, at)), lambda: now[0])
    assert scheduler.run_due() == T + 60
    assert fired == [("F.Schedule", T)]
    now[0] = T + 59.9
    scheduler.run_due()
    assert len(fired) == 1
    now[0] = T + 60
    scheduler.run_due()
    now[0] = T + 600  # stalled for nine minutes: one run, not nine
    assert scheduler.run_due() == T + 660
    assert [at for _, at in fired] == [T, T + 60, T + 120]


def test_scheduled_events_look_like_eventbridges() -> None:
    event = scheduled_event(ScheduleSpec("F", "F.Schedule", "rate(1 minute)", None), "us-east-1", T)
    assert event["detail-type"] == "Scheduled Event" and event["source"] == "aws.events"
    assert event["time"] == "2026-11-21T10:00:30Z"
    fixed = ScheduleSpec("F", "F.S", "rate(1 minute)", '{"k": 1}')
    assert scheduled_event(fixed, "us-east-1", T) == {"k": 1}


def event(**overrides: Any) -> dict[str, Any]:
    args: dict[str, Any] = {"route_key": "GET /p", "now": T}
    return apigw.proxy_event("GET", "/p", **{**args, **overrides})


def test_events_are_payload_format_2() -> None:
    built = apigw.proxy_event(
        "PATCH",
        "/v1/timers/x",
        route_key="PATCH /v1/timers/{id}",
        path_params={"id": "x"},
        headers=[("Host", "api.example.com"), ("User-Agent", "curl/8"), ("Content-Type", "a/b+c")],
        query="limit=5",
        body=b'{"a": 1}',
        source_ip="10.0.0.9",
        now=T,
    )
    context = built.pop("requestContext")
    assert built == {
        "version": "2.0",
        "routeKey": "PATCH /v1/timers/{id}",
        "rawPath": "/v1/timers/x",
        "rawQueryString": "limit=5",
        "headers": {"host": "api.example.com", "user-agent": "curl/8", "content-type": "a/b+c"},
        "queryStringParameters": {"limit": "5"},
        "pathParameters": {"id": "x"},
        "body": "eyJhIjogMX0=",  # not a text type: base64 (see the rules below)
        "isBase64Encoded": True,
    }
    assert context["http"] == {
        "method": "PATCH",
        "path": "/v1/timers/x",
        "protocol": "HTTP/1.1",
        "sourceIp": "10.0.0.9",
        "userAgent": "curl/8",
    }
    assert (context["routeKey"], context["stage"]) == ("PATCH /v1/timers/{id}", "$default")
    assert (context["domainName"], context["domainPrefix"]) == ("api.example.com", "api")
    assert (context["time"], context["timeEpoch"]) == ("21/Nov/2026:10:00:30 +0000", T * 1000)
    assert context["accountId"] == "123456789012" and context["apiId"] == "local"
    assert (
        len(context["requestId"]) == 16
        and context["requestId"] != event()["requestContext"]["requestId"]
    )


def test_repeated_headers_and_query_parameters_are_comma_joined() -> None:
    built = event(
        headers=[("X-A", "1"), ("x-a", "2"), ("Accept", "text/html"), ("X-A", "3")],
        query="s=a&s=b&t=&u=%C3%BC%20x&s=c&v",
    )
    assert built["headers"] == {"x-a": "1,2,3", "accept": "text/html"}
    assert built["rawQueryString"] == "s=a&s=b&t=&u=%C3%BC%20x&s=c&v"  # as sent
    assert built["queryStringParameters"] == {"s": "a,b,c", "t": "", "u": "ü x", "v": ""}


def test_cookie_headers_become_the_cookies_list() -> None:
    built = event(headers=[("Cookie", "a=1; b=2"), ("X-B", "y"), ("cookie", "c=3")])
    assert built["cookies"] == ["a=1", "b=2", "c=3"]
    assert built["headers"] == {"x-b": "y"}


def test_empty_parts_are_left_out() -> None:
    built = event()
    for absent in ("cookies", "queryStringParameters", "pathParameters", "body"):
        assert absent not in built
    assert (built["headers"], built["rawQueryString"], built["isBase64Encoded"]) == ({}, "", False)


@pytest.mark.parametrize(
    ("content_type", "body", "as_text"),
    [
        ("application/json", b'{"a": "\xc3\xbc"}', True),
        ("application/json; charset=utf-8", b"{}", True),
        ("text/plain", b"hello", True),
        ("application/xml", b"<a/>", True),
        ("application/javascript", b"x()", True),
        (None, b"{}", False),  # no Content-Type at all: base64
        ("application/x-www-form-urlencoded", b"a=1", False),
        ("application/octet-stream", b"\x00\x01", False),
        ("multipart/form-data; boundary=x", b"--x", False),
        ("application/json", b"\xff\xfe{}", False),  # a text type, but not UTF-8
    ],
)
def test_bodies_are_text_or_base64_by_content_type(
    content_type: str | None, body: bytes, as_text: bool
) -> None:
    headers = [("Content-Type", content_type)] if content_type else []
    built = event(headers=headers, body=body)
    assert built["isBase64Encoded"] is not as_text
    decoded = built["body"].encode() if as_text else base64.b64decode(built["body"])
    assert decoded == body


def test_a_named_stage_prefixes_the_raw_path() -> None:
    built = event(stage="prod")
    assert built["rawPath"] == built["requestContext"]["http"]["path"] == "/prod/p"
    assert built["requestContext"]["stage"] == "prod"


def result(**fields: Any) -> bytes:
    return json.dumps(fields).encode()


def test_results_map_back_to_http() -> None:
    response = apigw.from_proxy_result(
        result(
            statusCode=201,
            headers={"A": "1", "B": ["2", "3"]},
            multiValueHeaders={"C": ["4"]},  # a 1.0 field: ignored
            cookies=["s=1; HttpOnly", "t=2"],
            body=base64.b64encode(b"\x00bin").decode(),
            isBase64Encoded=True,
        )
    )
    assert response == apigw.HttpResponse(
        201,
        [("A", "1"), ("B", "2,3"), ("Set-Cookie", "s=1; HttpOnly"), ("Set-Cookie", "t=2")],
        b"\x00bin",
    )
    text = apigw.from_proxy_result(result(statusCode=204))
    assert text == apigw.HttpResponse(204, [], b"")


@pytest.mark.parametrize(
    "payload",
    [b'{"message": "hi", "n": 1}', b'"just a string"', b"[1, 2]", b"42", b"null"],
)
def test_a_result_without_status_code_is_a_200_json_body(payload: bytes) -> None:
    response = apigw.from_proxy_result(payload)
    assert response == apigw.HttpResponse(200, [("Content-Type", "application/json")], payload)


@pytest.mark.parametrize(
    "payload",
    [
        b"not json",
        result(statusCode="200"),
        result(statusCode=True),
        result(statusCode=99),
        result(statusCode=200, body={"a": 1}),
        result(statusCode=200, body="!!", isBase64Encoded=True),
        result(statusCode=200, headers=["A"]),
    ],
)
def test_a_result_api_gateway_cannot_use_is_none(payload: bytes) -> None:
    assert apigw.from_proxy_result(payload) is None  # the gateway answers 500


def test_the_http_apis_own_answers() -> None:
    missing = apigw.gateway_response(404)
    assert (missing.status, json.loads(missing.body)) == (404, {"message": "Not Found"})
    failed = apigw.gateway_response(500, "rid")
    assert (failed.status, json.loads(failed.body)) == (500, {"message": "Internal Server Error"})
    assert ("apigw-requestid", "rid") in failed.headers


HTTP_API_TEMPLATE = """
Resources:
  Api:
    Type: AWS::Serverless::HttpApi
    Properties: {StageName: prod}
  Fn:
    Type: AWS::Serverless::Function
    Properties:
      CodeUri: fn
      Handler: main.run
      Events:
        Special: {Type: HttpApi, Properties: {ApiId: !Ref Api, Path: /items/special, Method: get}}
        One: {Type: HttpApi, Properties: {ApiId: !Ref Api, Path: "/items/{id}", Method: GET}}
        AnyOne: {Type: HttpApi, Properties: {ApiId: !Ref Api, Path: "/items/{id}", Method: ANY}}
        Rest: {Type: HttpApi, Properties: {ApiId: !Ref Api, Path: "/items/{rest+}", Method: ANY}}
        Implicit: {Type: HttpApi, Properties: {Path: /implicit, Method: POST}}
  Other:
    Type: AWS::Serverless::Function
    Properties:
      CodeUri: other
      Handler: main.run
      Events:
        Everything: {Type: HttpApi, Properties: {ApiId: !Ref Api}}
"""


def test_routes_match_as_an_http_api_picks_them(tmp_path: Path) -> None:
    (tmp_path / "template.yaml").write_text(HTTP_API_TEMPLATE)
    stack = load_stack({}, path=tmp_path / "template.yaml")

    def picked(method: str, path: str) -> tuple[str, str, dict[str, str]]:
        route, params = stack.route(method, path) or (None, {})
        assert route is not None
        return route.key, route.function, params

    assert picked("GET", "/items/special") == ("GET /items/special", "Fn", {})
    assert picked("GET", "/items/7") == ("GET /items/{id}", "Fn", {"id": "7"})
    assert picked("DELETE", "/items/7") == ("ANY /items/{id}", "Fn", {"id": "7"})
    assert picked("PUT", "/items/special") == ("ANY /items/{id}", "Fn", {"id": "special"})
    assert picked("GET", "/items/7/parts/3") == ("ANY /items/{rest+}", "Fn", {"rest": "7/parts/3"})
    # No Path and Method: SAM's $default route. Everything nothing else serves goes there.
    assert picked("GET", "/elsewhere") == ("$default", "Other", {})
    assert picked("GET", "/implicit") == ("$default", "Other", {})
    route, _ = stack.route("POST", "/implicit") or (None, None)
    assert route is not None and route.stage == "$default"  # SAM's implicit HttpApi
    assert {r.stage for r in stack.routes if r.function == "Other"} == {"prod"}


@pytest.mark.parametrize(
    ("event_yaml", "error"),
    [
        ("{Type: Api, Properties: {Path: /a, Method: GET}}", "REST API"),
        (
            "{Type: HttpApi, Properties: {Path: /a, Method: GET, PayloadFormatVersion: '1.0'}}",
            "payload format 1.0",
        ),
        ("{Type: HttpApi, Properties: {ApiId: !Ref Nope, Path: /a, Method: GET}}", "ApiId"),
    ],
)
def test_api_events_the_local_gateway_cannot_serve_are_template_errors(
    tmp_path: Path, event_yaml: str, error: str
) -> None:
    (tmp_path / "template.yaml").write_text(
        "Resources:\n  Fn:\n    Type: AWS::Serverless::Function\n"
        "    Properties:\n      CodeUri: fn\n      Handler: main.run\n"
        f"      Events:\n        E: {event_yaml}\n"
    )
    with pytest.raises(TemplateError, match=error):
        load_stack({}, path=tmp_path / "template.yaml")


def test_the_template_is_read_from_the_given_path(tmp_path: Path) -> None:
    (tmp_path / "template.yaml").write_text(
        "Resources:\n  Fn:\n    Type: AWS::Serverless::Function\n"
        "    Properties: {CodeUri: fn, Handler: main.run, Timeout: 9}\n"
    )
    stack = load_stack({}, path=tmp_path / "template.yaml")
    assert (stack.functions["Fn"].module, stack.functions["Fn"].timeout_s) == ("main", 9.0)
    assert (stack.stack_name, stack.region, stack.routes) == ("timers", "us-east-1", [])


def test_the_ready_lines_name_the_api_and_its_console() -> None:
    from ops.local.stack import LocalConfig, LocalStack

    stack = LocalStack(LocalConfig(api_port=3100, aws_port=4600), say=lambda line: None)
    stack.demo = {"api_key": "tk_demo", "callback_queue_url": "http://q/demo"}
    assert stack.ready_lines() == [
        "API: http://127.0.0.1:3100/v1",
        "Console: http://127.0.0.1:3100/v1/console",
        "AWS endpoint: http://127.0.0.1:4600",
        "DynamoDB endpoint: http://127.0.0.1:4600",  # moto's
        "Redis: redis://127.0.0.1:6390/0",
        "Tenant demo API key: tk_demo",
        "Tenant demo callback queue: http://q/demo",
    ]
    real = LocalConfig(api_port=3100, redis_shards=3, dynamodb="local", dynamodb_port=8100)
    stack = LocalStack(real, say=lambda line: None)
    stack.demo = {"api_key": "tk_demo", "callback_queue_url": "http://q/demo"}
    assert stack.ready_lines()[3:5] == [
        "DynamoDB endpoint: http://127.0.0.1:8100",
        "Redis: redis://127.0.0.1:6390/0 (cluster: 3 masters + 3 replicas on 6390-6395)",
    ]


def test_redis_shards_and_dynamodb_come_from_the_environment_with_a_clear_error() -> None:
    from ops.local.stack import LocalConfig, StackError

    assert (LocalConfig.from_env({}).redis_shards, LocalConfig.from_env({}).dynamodb) == (1, "moto")
    config = LocalConfig.from_env({"REDIS_SHARDS": "3", "DYNAMODB": "local"})
    assert (config.cluster, list(config.redis_ports)) == (True, list(range(6390, 6396)))
    assert (config.dynamodb, config.dynamodb_port) == ("local", 8000)
    assert (16391, "the cluster bus of REDIS_PORT+1") in list(config.ports())
    assert (8000, "DYNAMODB_PORT") in list(config.ports())
    assert LocalConfig.from_env({"REDIS_SHARDS": "8"}).redis_ports == range(6390, 6406)
    for bad in ("2", "9", "0", "x", "-3"):
        with pytest.raises(StackError, match=f"REDIS_SHARDS={bad!r} is not 1"):
            LocalConfig.from_env({"REDIS_SHARDS": bad})
    with pytest.raises(StackError, match="DYNAMODB='foo' is not local"):
        LocalConfig.from_env({"DYNAMODB": "foo"})
    with pytest.raises(StackError, match="AWS_PORT and REDIS_PORT\\+3 are the same port, 4566"):
        LocalConfig.from_env({"REDIS_SHARDS": "3", "REDIS_PORT": "4563"})
    with pytest.raises(StackError, match="below 65536"):
        LocalConfig.from_env({"REDIS_SHARDS": "3", "REDIS_PORT": "60000"})


def test_the_sandbox_idle_time_comes_from_the_environment_with_a_clear_error() -> None:
    from ops.local.stack import LocalConfig, StackError

    assert LocalConfig.from_env({}).idle_s == 300
    assert LocalConfig.from_env({"LOCAL_LAMBDA_IDLE_S": "20"}).idle_s == 20
    for bad in ("0", "1.5", "soon", "100000"):
        with pytest.raises(StackError, match="LOCAL_LAMBDA_IDLE_S="):
            LocalConfig.from_env({"LOCAL_LAMBDA_IDLE_S": bad})


def test_one_stack_holds_a_state_directory_and_only_its_own_files_go(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ops.local import state

    monkeypatch.setenv("LOCAL_STATE_DIR", str(tmp_path))
    running, second = state.Lock(), state.Lock()
    running.acquire()
    state.write({"pid": os.getpid(), "api_url": "http://127.0.0.1:3000/v1"})
    with pytest.raises(state.StateDirBusy, match=r"already running from .* \(pid \d+, API http"):
        second.acquire()
    assert not second.held and state.read() is not None
    running.release()
    second.acquire()  # the kernel let it go
    second.release()


def test_a_killed_stacks_children_are_named_only_while_they_run_the_same_program(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ops.local import state

    monkeypatch.setenv("LOCAL_STATE_DIR", str(tmp_path))
    exited = subprocess.Popen(["true"])
    exited.wait()
    dead_stack = exited.pid  # a stack killed outright
    me = os.getpid()
    state.record_children(dead_stack, {me: "python", dead_stack: "redis-server :6390"})
    assert state.leftovers() == {me: "python"}
    state.record_children(dead_stack, {me: "redis-server :6390"})  # a reused pid
    assert state.leftovers() == {}
    state.record_children(me, {me: "python"})  # its stack still runs: nothing left over
    assert state.leftovers() == {}
    other = subprocess.Popen(["sleep", "30"])
    started = time.monotonic()  # its command line names sleep once its exec is done
    while not state._runs(other.pid, "sleep") and time.monotonic() - started < 5:
        time.sleep(0.01)
    try:  # recorded higher pid first (children start side by side): the line names them by pid
        first, second = sorted([(me, "python"), (other.pid, "sleep")], reverse=True)
        state.record_children(dead_stack, dict([first, second]))
        assert list(state.leftovers()) == sorted([me, other.pid])
    finally:
        other.kill()
        other.wait()

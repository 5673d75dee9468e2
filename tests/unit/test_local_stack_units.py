"""The local stack's pure parts: reading template.yaml, schedules, API Gateway mapping."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime
from pathlib import Path

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
    }
    fanout = stack.functions["FanoutFunction"]
    assert (fanout.module, fanout.attr) == ("app", "handler")
    assert fanout.code_paths[0].endswith("functions/fanout")
    assert fanout.code_paths[1].endswith("layers/shared")  # the shared layer, via Globals
    assert fanout.environment["TRIGGER_FUNCTION_NAME"] == "TriggerFunction"
    assert fanout.environment["TIMERS_TABLE"] == "TimersTable"
    assert fanout.environment["TENANT_QUEUE_PREFIX"] == "timers-tenant-"  # ${AWS::StackName}
    assert fanout.environment["BUCKET_COUNT"] == "64"  # samconfig.toml's override
    assert fanout.environment["REDIS_URL"] == LOCAL["REDIS_URL"]  # the local stand-in wins
    assert (fanout.timeout_s, fanout.memory_mb, fanout.async_retries) == (75.0, 256, 0)
    assert stack.functions["TriggerFunction"].memory_mb == 512


def test_api_routes_and_schedules_come_from_the_events() -> None:
    stack = load_stack(LOCAL)
    route, params = stack.route("POST", "/v1/timers/tmr_1/pause") or (None, None)
    assert route is not None and (route.resource, route.stage) == ("/v1/timers/{id}/pause", "prod")
    assert params == {"id": "tmr_1"}
    assert stack.route("PUT", "/v1/timers") is None
    assert stack.route("GET", "/v1/timers/a/b") is None
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


def test_proxy_events_carry_multi_values_and_encode_binary_bodies() -> None:
    event = apigw.proxy_event(
        "GET",
        "/v1/timers/x",
        resource="/v1/timers/{id}",
        path_params={"id": "x"},
        stage="prod",
        headers=[("X-A", "1"), ("X-A", "2")],
        query=[("s", "a"), ("s", "b")],
        body=b"\xff\x00",
    )
    assert event["headers"] == {"X-A": "2"} and event["multiValueHeaders"] == {"X-A": ["1", "2"]}
    assert event["queryStringParameters"] == {"s": "b"}
    assert event["multiValueQueryStringParameters"] == {"s": ["a", "b"]}
    assert event["requestContext"]["path"] == "/prod/v1/timers/x"
    assert event["isBase64Encoded"] is True and base64.b64decode(event["body"]) == b"\xff\x00"
    text = apigw.proxy_event("POST", "/p", resource="/p", path_params={}, stage="s", body=b"{}")
    assert (text["body"], text["isBase64Encoded"], text["pathParameters"]) == ("{}", False, None)


def test_proxy_results_map_back_to_http() -> None:
    result = {
        "statusCode": 201,
        "headers": {"A": "1", "B": "x"},
        "multiValueHeaders": {"B": ["2", "3"]},
        "body": base64.b64encode(b"\x00bin").decode(),
        "isBase64Encoded": True,
    }
    response = apigw.from_proxy_result(json.dumps(result).encode())
    assert response == apigw.HttpResponse(201, [("A", "1"), ("B", "2"), ("B", "3")], b"\x00bin")
    assert apigw.from_proxy_result(b'"not a proxy result"') is None


def test_gateway_responses_follow_the_template() -> None:
    responses = load_stack(LOCAL).gateway_responses
    missing = apigw.gateway_response("MISSING_AUTHENTICATION_TOKEN", responses)
    assert missing.status == 404
    assert json.loads(missing.body)["error"]["code"] == "not_found"
    failed = apigw.gateway_response("INTEGRATION_FAILURE", responses)
    assert failed.status == 502
    assert json.loads(failed.body)["error"] == {
        "code": "internal_error",
        "message": "Internal server error",
        "details": [],
    }
    assert apigw.gateway_response("MISSING_AUTHENTICATION_TOKEN", {}).status == 403


def test_the_template_is_read_from_the_given_path(tmp_path: Path) -> None:
    (tmp_path / "template.yaml").write_text(
        "Resources:\n  Fn:\n    Type: AWS::Serverless::Function\n"
        "    Properties: {CodeUri: fn, Handler: main.run, Timeout: 9}\n"
    )
    stack = load_stack({}, path=tmp_path / "template.yaml")
    assert (stack.functions["Fn"].module, stack.functions["Fn"].timeout_s) == ("main", 9.0)
    assert (stack.stack_name, stack.region, stack.routes) == ("timers", "us-east-1", [])

"""template.yaml and the code must agree: handlers exist, tables match the models, env is complete.

`sam build` happily builds a function whose CodeUri is missing, so this is where it is caught.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import fields
from typing import Any

import pytest
from pynamodb.models import Model

from ops import template
from timers.adapters import claims, idempotency, tenants, timers_table, wakeups
from timers.config import LOCAL_ONLY, Settings
from timers.core.webhooks import RETRY_FOR_MS, backoff_s

FUNCTIONS = template.resources("AWS::Serverless::Function")
TABLES = template.resources("AWS::DynamoDB::Table")


@pytest.mark.parametrize("logical_id", sorted(FUNCTIONS))
def test_every_function_has_its_handler(logical_id: str) -> None:
    props = FUNCTIONS[logical_id]
    module_name, attr = props["Handler"].rsplit(".", 1)
    package = props["CodeUri"].replace("/", ".")
    module = importlib.import_module(f"{package}.{module_name}")
    assert callable(getattr(module, attr))


def _keys(schema: list[dict[str, str]]) -> dict[str, str]:
    return {k["KeyType"]: k["AttributeName"] for k in schema}


def _model_keys(model: type[Model]) -> dict[str, str]:
    keys = {}
    for name, attr in model.get_attributes().items():
        if attr.is_hash_key:
            keys["HASH"] = name
        if attr.is_range_key:
            keys["RANGE"] = name
    return keys


@pytest.mark.parametrize(
    ("logical_id", "model"),
    [
        ("TimersTable", timers_table.TimerItem),
        ("TimersTable", timers_table.PayloadItem),
        ("WakeupsTable", wakeups.WakeupItem),
        ("IdempotencyTable", idempotency.IdempotencyItem),
        ("TenantsTable", tenants.TenantItem),
        ("TenantsTable", tenants.ApiKeyItem),
    ],
)
def test_models_match_the_tables(logical_id: str, model: type[Model]) -> None:
    props: dict[str, Any] = TABLES[logical_id]
    assert _model_keys(model) == _keys(props["KeySchema"])
    indexes = {i["IndexName"]: i for i in props.get("GlobalSecondaryIndexes", [])}
    model_indexes = {
        index.Meta.index_name: index
        for index in vars(model).values()
        if hasattr(index, "Meta") and hasattr(index.Meta, "index_name")
    }
    assert set(model_indexes) <= set(indexes)  # (the payload items share the timers' table)
    for name, index in model_indexes.items():
        declared = {
            ("RANGE" if attr.is_range_key else "HASH"): attr.attr_name
            for attr in index.Meta.attributes.values()
        }
        assert declared == _keys(indexes[name]["KeySchema"])
        projection = indexes[name]["Projection"]
        assert index.Meta.projection.projection_type == projection["ProjectionType"]
        assert sorted(getattr(index.Meta.projection, "non_key_attributes", None) or []) == sorted(
            projection.get("NonKeyAttributes", [])
        )
    ttl = props.get("TimeToLiveSpecification", {}).get("AttributeName")
    if ttl:
        assert ttl in model.get_attributes()


def test_the_claims_table_is_keyed_and_expires_as_the_claim_store_writes_it() -> None:
    props: dict[str, Any] = TABLES["ClaimsTable"]
    assert _keys(props["KeySchema"]) == {"HASH": "k"}
    assert props["TimeToLiveSpecification"]["AttributeName"] == claims.TTL_ATTRIBUTE


def test_every_setting_is_configured_by_the_template() -> None:
    doc = template.load()
    env = dict(doc["Globals"]["Function"]["Environment"]["Variables"])
    for props in FUNCTIONS.values():
        env.update(props.get("Environment", {}).get("Variables", {}))
    assert {f.name.upper() for f in fields(Settings) if f.name not in LOCAL_ONLY} <= set(env)


def test_the_template_never_allows_loopback_webhook_targets() -> None:
    text = template.TEMPLATE.read_text()
    for name in LOCAL_ONLY:
        assert f"{name.upper()}:" not in text


def test_the_delivery_function_reads_its_queue_as_lambda_would_and_reaches_the_internet() -> None:
    props = FUNCTIONS["DeliveryFunction"]
    assert "VpcConfig" not in props  # the private VPC has no internet path
    assert "VpcConfig" not in template.load()["Globals"]["Function"]
    for name in ("ApiFunction", "MigratorFunction", "FanoutFunction", "TriggerFunction"):
        assert "VpcConfig" in FUNCTIONS[name]
    event = props["Events"]["Deliveries"]
    assert event["Type"] == "SQS"
    assert event["Properties"]["FunctionResponseTypes"] == ["ReportBatchItemFailures"]
    queue = template.resources("AWS::SQS::Queue")["DeliveryQueue"]
    assert queue["VisibilityTimeout"] >= 6 * props["Timeout"]


def test_ingress_is_an_http_api_with_a_catch_all_route_to_the_api_function() -> None:
    assert template.resources("AWS::Serverless::Api") == {}  # no REST API left
    api = template.resources("AWS::Serverless::HttpApi")["TimersApi"]
    assert api["StageName"] == "$default"
    throttle = api["DefaultRouteSettings"]
    assert throttle["ThrottlingRateLimit"] == template.Tag("Ref", "ApiThrottleRateLimit")
    assert throttle["ThrottlingBurstLimit"] == template.Tag("Ref", "ApiThrottleBurstLimit")
    events = FUNCTIONS["ApiFunction"]["Events"]
    assert {e["Type"] for e in events.values()} == {"HttpApi"}
    assert all(
        e["Properties"]["ApiId"] == template.Tag("Ref", "TimersApi") for e in events.values()
    )
    catch_all = [e["Properties"] for e in events.values() if e["Properties"]["Path"] == "$default"]
    assert [p["Method"] for p in catch_all] == ["ANY"]
    url = template.load()["Outputs"]["ApiUrl"]["Value"]
    assert url.value == "https://${TimersApi}.execute-api.${AWS::Region}.amazonaws.com/v1"


def _template_routes() -> set[tuple[str, str]]:
    events = FUNCTIONS["ApiFunction"]["Events"].values()
    return {
        (e["Properties"]["Method"].upper(), e["Properties"]["Path"])
        for e in events
        if e["Properties"]["Path"] != "$default"
    }


def test_the_template_routes_are_exactly_the_openapi_documents_operations() -> None:
    from functions.api import app

    paths = app.openapi_schema().model_dump(by_alias=True, exclude_none=True)["paths"]
    documented = {
        (method.upper(), re.sub(r"\{\w+\}", "{id}", path))
        for path, item in paths.items()
        for method in item
    }
    assert documented == _template_routes()


def test_the_functions_route_table_serves_exactly_the_template_routes() -> None:
    from functions.api import app

    by_path: dict[str, set[str]] = {}
    for method, path in _template_routes():
        by_path.setdefault(path.replace("{id}", "tmr_x"), set()).add(method)
    for path, methods in by_path.items():
        assert set(app.route_methods(path)) == methods, path
    assert app.route_methods("/v1/timers/tmr_x/nope") == {}
    assert app.route_methods("/v1") == {}


def test_a_message_the_delivery_function_keeps_failing_on_is_redriven_to_be_settled() -> None:
    queues = template.resources("AWS::SQS::Queue")
    delivery = queues["DeliveryQueue"]
    redrive = delivery["RedrivePolicy"]
    moved_to = template.Tag("GetAtt", "DeliveryRedriveQueue.Arn")
    assert redrive["deadLetterTargetArn"] == moved_to
    assert FUNCTIONS["DeliveryFunction"]["Events"]["Redriven"]["Properties"]["Queue"] == moved_to
    assert "RedrivePolicy" not in queues["DeliveryRedriveQueue"]  # it waits to be settled
    # Receives are attempts (deferrals re-send the message): the most a fire's 24 h of retries
    # can make (every backoff its shortest) stay below maxReceiveCount ...
    attempts, elapsed_s = 1, 0.0
    while elapsed_s * 1000 < RETRY_FOR_MS:
        elapsed_s += backoff_s(attempts, 0.0)
        attempts += 1
    assert attempts < redrive["maxReceiveCount"]
    # ... and a message the function crashes on (back after each visibility timeout) reaches it
    # well before SQS's retention would drop it silently.
    crashing_s = redrive["maxReceiveCount"] * delivery["VisibilityTimeout"]
    assert 2 * crashing_s < delivery["MessageRetentionPeriod"]

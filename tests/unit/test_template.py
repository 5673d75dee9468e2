"""template.yaml and the code must agree: handlers exist, tables match the models, env is complete.

`sam build` happily builds a function whose CodeUri is missing, so this is where it is caught.
"""

from __future__ import annotations

import importlib
import logging
import re
from collections.abc import Callable
from dataclasses import fields
from typing import Any

import pytest
from pynamodb.models import Model

from ops import template
from timers.api.idempotency import IdempotencyStore
from timers.config import LOCAL_ONLY, Settings
from timers.core.webhook_attempts import backoff_s
from timers.core.webhooks import RETRY_FOR_MS
from timers.engine import log as fire_log
from timers.engine.changes import CREATE_MS
from timers.runtime import quiet_root_logger
from timers.store.timers_table import TimerStore
from timers.tenancy.tenants import TenantStore

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
    ("logical_id", "bound"),
    [
        ("TimersTable", lambda table: TimerStore(table).models.timer),
        ("TimersTable", lambda table: TimerStore(table).models.payload),
        ("IdempotencyTable", lambda table: IdempotencyStore(table).model),
        ("TenantsTable", lambda table: TenantStore(table).models.tenant),
        ("TenantsTable", lambda table: TenantStore(table).models.api_key),
        ("TenantsTable", lambda table: TenantStore(table).models.revocations),
    ],
    ids=["timers", "payloads", "idempotency", "tenants", "api-keys", "revocations"],
)
def test_models_match_the_tables(logical_id: str, bound: Callable[[str], type[Model]]) -> None:
    """Each model as its store binds it, here to a table named by the logical id."""
    model = bound(logical_id)
    assert model.Meta.table_name == logical_id
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


def test_the_claims_table_is_keyed_and_expires_as_the_fire_log_writes_it() -> None:
    props: dict[str, Any] = TABLES["ClaimsTable"]
    assert _keys(props["KeySchema"]) == {"HASH": "k"}
    assert props["TimeToLiveSpecification"]["AttributeName"] == fire_log.TTL


def test_the_wakeups_table_is_keyed_and_expires_as_the_listings_are_written() -> None:
    props: dict[str, Any] = TABLES["WakeupsTable"]
    assert _keys(props["KeySchema"]) == {"HASH": "shard", "RANGE": "wake"}
    assert props["TimeToLiveSpecification"]["AttributeName"] == "expires_at"


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


def _any_params(path: str) -> str:
    """A route's path with each parameter named ``{id}`` (the template and the code name
    them differently: ``{id}``, ``{timer_id}``)."""
    return re.sub(r"\{\w+\}", "{id}", path)


def _template_routes() -> set[tuple[str, str]]:
    events = FUNCTIONS["ApiFunction"]["Events"].values()
    return {
        (e["Properties"]["Method"].upper(), _any_params(e["Properties"]["Path"]))
        for e in events
        if e["Properties"]["Path"] != "$default"
    }


def test_the_template_routes_are_exactly_the_openapi_documents_operations() -> None:
    from functions.api.app import openapi, static_files

    paths = openapi.openapi_schema().model_dump(by_alias=True, exclude_none=True)["paths"]
    documented = {
        (method.upper(), _any_params(path)) for path, item in paths.items() for method in item
    }
    files = {("GET", path) for path in static_files.STATIC_PATHS}  # not API operations
    assert not documented & files
    assert documented | files == _template_routes()


def test_the_functions_route_table_serves_exactly_the_template_routes() -> None:
    from functions.api.app import routing

    by_path: dict[str, set[str]] = {}
    for method, path in _template_routes():
        by_path.setdefault(path.replace("{id}", "tmr_x"), set()).add(method)
    assert "/v1/timers/tmr_x/fires/tmr_x/redeliver" in by_path
    for path, methods in by_path.items():
        assert set(routing.route_methods(path)) == methods, path
    assert routing.route_methods("/v1/timers/tmr_x/nope") == {}
    assert routing.route_methods("/v1") == {}


def test_the_api_answers_before_the_gateway_gives_up_and_before_lambda_kills_it() -> None:
    """The api's own deadline (503 with Retry-After) comes before the function's Timeout (a
    Lambda timeout is API Gateway's 500) and before each route's integration timeout (API
    Gateway's own 503), which the function's Timeout is under too."""
    from functions.api.app import deadline

    api = template.resources("AWS::Serverless::Function")["ApiFunction"]
    timeout_ms = api["Timeout"] * 1000
    assert timeout_ms > deadline.TIMEOUT_MARGIN_MS  # time to work before the margin
    events = [e for e in api["Events"].values() if e["Type"] == "HttpApi"]
    assert events
    for event in events:
        integration_ms = event["Properties"].get("TimeoutInMillis", 30_000)
        assert integration_ms > max(deadline.ANSWER_WITHIN_MS, timeout_ms), event


# ---------------------------------------------------------------- hardening (issue 19)

RESOURCES: dict[str, dict[str, Any]] = template.load()["Resources"]
PARAMETERS: dict[str, dict[str, Any]] = template.load()["Parameters"]
ACCOUNT_CONCURRENCY = 1_000  # Lambda's default account quota
UNRESERVED_FLOOR = 100  # Lambda refuses a reservation that leaves less unreserved


def _default(value: Any) -> int:
    """A literal, or the default of the parameter a ``!Ref`` names."""
    return int(template.as_deployed(value))


def test_every_function_reserves_concurrency_and_the_defaults_leave_the_account_room() -> None:
    from timers.engine import fanout

    reserved = {name: p.get("ReservedConcurrentExecutions") for name, p in FUNCTIONS.items()}
    assert None not in reserved.values(), reserved
    # The api's is a parameter (its cap); the trigger gets what the fan-out can start at once.
    assert reserved["ApiFunction"] == template.Tag("Ref", "ApiReservedConcurrency")
    assert _default(reserved["TriggerFunction"]) >= (
        _default(template.Tag("Ref", "BucketCount")) * fanout.MAX_PARALLEL
    )
    # The delivery function runs what its event sources may start together: fewer, and a
    # throttled batch counts a receive toward the dead-letter queue.
    sources = FUNCTIONS["DeliveryFunction"]["Events"].values()
    starts = sum(_default(e["Properties"]["ScalingConfig"]["MaximumConcurrency"]) for e in sources)
    assert _default(reserved["DeliveryFunction"]) == starts
    # Fan-out runs overlap (a minute each, plus slack) and one may start twice.
    assert _default(reserved["FanoutFunction"]) >= 2
    assert _default(reserved["MigratorFunction"]) >= 1
    total = sum(_default(v) for v in reserved.values())
    assert total <= ACCOUNT_CONCURRENCY - UNRESERVED_FLOOR


def _statements(props: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(SAM policy templates, inline statements) of a function's Policies."""
    templates, statements = [], []
    for policy in props.get("Policies", []):
        if "Statement" in policy:
            statements += [s for s in policy["Statement"] if isinstance(s, dict)]
        else:
            templates.append(policy)
    return templates, statements


def _actions(statement: dict[str, Any]) -> set[str]:
    action = statement["Action"]
    return {action} if isinstance(action, str) else set(action)


def _on(statements: list[dict[str, Any]], table: str) -> set[str]:
    arn = template.Tag("GetAtt", f"{table}.Arn")
    return {a for s in statements if s["Resource"] == arn for a in _actions(s)}


def _templated_tables(templates: list[dict[str, Any]]) -> set[str]:
    return {
        args["TableName"].value
        for policy in templates
        for args in policy.values()
        if isinstance(args, dict) and isinstance(args.get("TableName"), template.Tag)
    }


def test_the_internet_facing_delivery_function_gets_and_updates_claims_and_nothing_more() -> None:
    templates, statements = _statements(FUNCTIONS["DeliveryFunction"])
    assert _templated_tables(templates) == set()  # no SAM policy template on any table
    # DeliveryRecords.read_delivery (GetItem), write_delivery and TargetSlots (UpdateItem).
    assert _on(statements, "ClaimsTable") == {"dynamodb:GetItem", "dynamodb:UpdateItem"}
    assert _on(statements, "TenantsTable") == {"dynamodb:GetItem"}  # signing secrets
    # FailedFireStore.put: it records failures, and never reads or changes another's.
    assert _on(statements, "FailedFiresTable") == {"dynamodb:PutItem"}
    assert all(s["Effect"] == "Allow" and "*" not in str(s["Resource"]) for s in statements)


def test_the_api_function_reads_tenants_item_by_item_only() -> None:
    templates, statements = _statements(FUNCTIONS["ApiFunction"])
    assert "TenantsTable" not in _templated_tables(templates)
    # Keys by their hashes (a tenant's own keys: /v1/tenant/keys); no Scan or Query of the
    # table that holds every tenant's secrets.
    assert _on(statements, "TenantsTable") == {
        "dynamodb:GetItem", "dynamodb:BatchGetItem", "dynamodb:PutItem", "dynamodb:UpdateItem",
        "dynamodb:DeleteItem", "dynamodb:ConditionCheckItem",
    }  # fmt: skip


def test_the_api_function_lists_and_redelivers_failed_fires_and_nothing_more() -> None:
    templates, statements = _statements(FUNCTIONS["ApiFunction"])
    assert "FailedFiresTable" not in _templated_tables(templates)
    # FailedFireStore.page and not_redelivered (Query), get, mark_redelivered; no Scan, no Put.
    assert _on(statements, "FailedFiresTable") == {
        "dynamodb:Query",
        "dynamodb:GetItem",
        "dynamodb:UpdateItem",
    }
    queue = template.Tag("GetAtt", "DeliveryQueue.Arn")
    assert {a for s in statements if s["Resource"] == queue for a in _actions(s)} == {
        "sqs:SendMessage"
    }


def test_the_failed_fires_table_is_keyed_and_expires_as_its_store_writes_it() -> None:
    from timers.delivery import failed_fires

    props: dict[str, Any] = TABLES["FailedFiresTable"]
    assert _keys(props["KeySchema"]) == {"HASH": "tenant", "RANGE": "at"}
    assert props["TimeToLiveSpecification"]["AttributeName"] == failed_fires.TTL_ATTRIBUTE


def test_every_queue_is_encrypted_at_rest() -> None:
    queues = template.resources("AWS::SQS::Queue")
    assert queues
    for name, props in queues.items():
        assert props.get("SqsManagedSseEnabled") is True or "KmsMasterKeyId" in props, name


def test_every_table_is_encrypted_and_recoverable_to_a_point_in_time() -> None:
    for name, props in TABLES.items():
        assert props["SSESpecification"]["SSEEnabled"] is True, name
        pitr = props.get("PointInTimeRecoverySpecification", {})
        assert pitr.get("PointInTimeRecoveryEnabled") is True, name


def test_the_api_logs_each_request_without_headers_keys_or_bodies() -> None:
    import json

    api = template.resources("AWS::Serverless::HttpApi")["TimersApi"]
    settings = api["AccessLogSettings"]
    destination = settings["DestinationArn"]
    assert isinstance(destination, template.Tag) and destination.name == "GetAtt"
    group = RESOURCES[destination.value.removesuffix(".Arn")]
    assert group["Type"] == "AWS::Logs::LogGroup"
    assert group["Properties"]["RetentionInDays"] == template.Tag("Ref", "LogRetentionDays")
    fields_ = json.loads(settings["Format"])
    assert {"requestId", "ip", "routeKey", "status", "latency"} <= set(fields_)
    variables = " ".join(fields_.values()).lower()
    for leak in ("header", "apikey", "api_key", "path", "querystring", "body", "authorizer"):
        assert leak not in variables, leak


def test_every_checkov_skip_says_why() -> None:
    skips = [
        (name, skip)
        for name, res in RESOURCES.items()
        for skip in res.get("Metadata", {}).get("checkov", {}).get("skip", [])
    ]
    assert skips  # the exceptions are declared in the template, next to their resource
    for name, skip in skips:
        assert re.fullmatch(r"CKV2?_AWS_\d+", skip["id"]), (name, skip)
        assert len(str(skip.get("comment", "")).split()) >= 8, (name, skip["id"])


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


def test_interface_endpoints_sit_in_one_zone_unless_two_are_asked_for() -> None:
    """InterfaceEndpointAzs (docs/cost.md: half the idle month's largest item): "1" puts the
    SQS and Lambda endpoints' interfaces in one subnet, which serves both; "2" in each."""
    assert PARAMETERS["InterfaceEndpointAzs"]["Default"] == "1"
    conditions = template.load()["Conditions"]
    assert conditions["EndpointsInTwoAzs"] == template.Tag(
        "Equals", [template.Tag("Ref", "InterfaceEndpointAzs"), "2"]
    )
    a, b = template.Tag("Ref", "PrivateSubnetA"), template.Tag("Ref", "PrivateSubnetB")
    endpoints = template.resources("AWS::EC2::VPCEndpoint")
    for name in ("SqsEndpoint", "LambdaEndpoint"):
        assert endpoints[name]["SubnetIds"] == template.Tag(
            "If", ["EndpointsInTwoAzs", [a, b], [a]]
        ), name


def test_tracing_is_a_parameter_passed_through_by_default() -> None:
    """Lambda samples active tracing at 1 request/s + 5 %, not configurable: at a few creates
    a second nearly every request is a $5-per-million trace (docs/cost.md)."""
    assert PARAMETERS["FunctionTracing"]["Default"] == "PassThrough"
    assert template.load()["Globals"]["Function"]["Tracing"] == template.Tag(
        "Ref", "FunctionTracing"
    )
    for name, fn in FUNCTIONS.items():
        assert fn.get("Tracing", template.Tag("Ref", "FunctionTracing")) in (
            template.Tag("Ref", "FunctionTracing"),
            "PassThrough",
        ), name


def test_lambdas_platform_lines_are_off_and_the_functions_levels_follow_log_level() -> None:
    """PlatformLogLevel WARN (docs/cost.md): no START/END/REPORT line per invocation. Level
    filtering needs the JSON log format; Lambda's application level is LogLevel itself, never
    above INFO: the metrics are EMF lines with no level, which Lambda files at INFO."""
    assert PARAMETERS["PlatformLogLevel"]["Default"] == "WARN"
    logging_config = template.load()["Globals"]["Function"]["LoggingConfig"]
    assert logging_config["LogFormat"] == "JSON"
    assert logging_config["SystemLogLevel"] == template.Tag("Ref", "PlatformLogLevel")
    assert logging_config["ApplicationLogLevel"] == template.Tag("Ref", "LogLevel")
    assert PARAMETERS["LogLevel"]["AllowedValues"] == ["DEBUG", "INFO"]
    for name, fn in FUNCTIONS.items():  # each keeps only its log group (merged with Globals)
        assert set(fn["LoggingConfig"]) == {"LogGroup"}, name


def test_the_root_logger_stays_at_warning_under_lambdas_json_format() -> None:
    """With the JSON format Lambda's runtime sets the root logger to ApplicationLogLevel before
    it imports the handler; the layer puts it back to WARNING, as the text format had it (no
    new botocore or library lines billed). Elsewhere (tests, the local stack) it is left be."""
    root = logging.getLogger()
    before = root.level
    try:
        root.setLevel(logging.INFO)  # what the runtime does for ApplicationLogLevel INFO
        quiet_root_logger({"AWS_LAMBDA_LOG_LEVEL": "INFO"})
        assert root.level == logging.WARNING
        root.setLevel(logging.INFO)
        quiet_root_logger({})
        assert root.level == logging.INFO
    finally:
        root.setLevel(before)


def test_a_create_in_flight_ends_well_within_CREATE_MS() -> None:
    """R4: the migrator keeps a listing without its timer for CREATE_MS (a create may be in
    flight); the api function's timeout bounds a create."""
    assert 6 * FUNCTIONS["ApiFunction"]["Timeout"] * 1000 <= CREATE_MS


def test_the_group_index_is_sparse_and_keys_only_and_the_groups_table_is_the_stores() -> None:
    """A group costs no write per fire: the index holds keys only (a checkpoint or a
    completion changes none of them), on the attribute only a grouped timer has."""
    from timers.store import timers_table

    props: dict[str, Any] = TABLES["TimersTable"]
    (index,) = props["GlobalSecondaryIndexes"]
    assert index["IndexName"] == timers_table.GROUP_INDEX
    assert _keys(index["KeySchema"]) == {"HASH": "grp", "RANGE": "timer_id"}
    assert index["Projection"] == {"ProjectionType": "KEYS_ONLY"}
    assert "grp" in TimerStore("TimersTable").models.timer.get_attributes()
    groups: dict[str, Any] = TABLES["GroupsTable"]
    assert _keys(groups["KeySchema"]) == {"HASH": "tenant", "RANGE": "name"}


def test_the_api_function_reads_and_writes_group_records_and_nothing_more() -> None:
    templates, statements = _statements(FUNCTIONS["ApiFunction"])
    assert "GroupsTable" not in _templated_tables(templates)
    # GroupStore: get, page (Query), touch/progress/finished (UpdateItem), forget (DeleteItem)
    assert _on(statements, "GroupsTable") == {
        "dynamodb:GetItem", "dynamodb:Query", "dynamodb:UpdateItem", "dynamodb:DeleteItem",
    }  # fmt: skip

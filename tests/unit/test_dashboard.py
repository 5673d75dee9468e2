"""The dashboard and the alarms read metrics that exist, so no widget stays empty.

Custom metrics (namespace ``Timers``): the emitted set comes from running each function's
handler with its work stubbed out by a report whose every counter is non-zero (so every branch
that emits runs) and capturing the EMF blocks powertools prints: names, namespace and
dimensions exactly as CloudWatch will read them. AWS metrics: the name must be one the service
publishes (the lists below, with their sources) and each dimension must point at a resource of
the template of the right type.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from functions.delivery import app as delivery_app
from functions.fanout import app as fanout_app
from functions.migrator import app as migrator_app
from functions.trigger import app as trigger_app
from ops import template
from ops.local.context import LambdaContext
from timers.core.lag import LAG_LEVELS
from timers.delivery.messages import BatchReport, Outcome
from timers.engine.fanout import FanoutReport
from timers.engine.migrate import MigrationReport
from timers.engine.trigger import TriggerReport

ROOT = Path(__file__).resolve().parents[2]
DOC = template.load()
RESOURCES: dict[str, dict[str, Any]] = DOC["Resources"]
PARAMETERS: dict[str, dict[str, Any]] = DOC["Parameters"]
ENV = DOC["Globals"]["Function"]["Environment"]["Variables"]
NAMESPACE = ENV["POWERTOOLS_METRICS_NAMESPACE"]
Emitted = set[tuple[str, str, frozenset[tuple[str, str]]]]  # (namespace, name, dimensions)


@dataclass(frozen=True)
class Ref:
    """A dimension value the stack fills in: ``!Ref resource`` or ``!GetAtt resource.attr``."""

    resource: str
    attribute: str | None = None


@dataclass(frozen=True)
class MetricUse:
    where: str
    namespace: str
    name: str
    dimensions: tuple[tuple[str, str | Ref], ...]


# ---------------------------------------------------------------- what AWS publishes


@dataclass(frozen=True)
class AwsNamespace:
    source: str
    names: frozenset[str]
    dimensions: dict[str, tuple[str, str | None]]  # name -> (resource type, GetAtt attribute)


AWS_METRICS = {
    "AWS/Lambda": AwsNamespace(
        "https://docs.aws.amazon.com/lambda/latest/dg/monitoring-metrics-types.html",
        frozenset(
            {
                "Invocations",
                "Errors",
                "Throttles",
                "Duration",
                "ConcurrentExecutions",
                "AsyncEventsReceived",
                "AsyncEventAge",
                "AsyncEventsDropped",
                "DeadLetterErrors",
                "DestinationDeliveryFailures",
            }
        ),
        {"FunctionName": ("AWS::Serverless::Function", None)},  # Ref = the function's name
    ),
    "AWS/SQS": AwsNamespace(
        "https://docs.aws.amazon.com/AWSSimpleQueueService/latest/SQSDeveloperGuide/sqs-available-cloudwatch-metrics.html",
        frozenset(
            {
                "ApproximateAgeOfOldestMessage",
                "ApproximateNumberOfMessagesDelayed",
                "ApproximateNumberOfMessagesNotVisible",
                "ApproximateNumberOfMessagesVisible",
                "NumberOfEmptyReceives",
                "NumberOfMessagesDeleted",
                "NumberOfMessagesReceived",
                "NumberOfMessagesSent",
                "SentMessageSize",
            }
        ),
        {"QueueName": ("AWS::SQS::Queue", "QueueName")},  # Ref would be the URL
    ),
    # HTTP APIs: not the REST APIs' 4XXError/5XXError. Dimension sets ApiId, ApiId+Stage,
    # ApiId+Stage+Route; the stack has one stage, so ApiId alone is the whole API.
    "AWS/ApiGateway": AwsNamespace(
        "https://docs.aws.amazon.com/apigateway/latest/developerguide/http-api-metrics.html",
        frozenset({"4xx", "5xx", "Count", "Latency", "IntegrationLatency", "DataProcessed"}),
        {"ApiId": ("AWS::Serverless::HttpApi", None)},
    ),
    # Serverless caches: dimension clusterId (the cache's name, its Ref); no CPU metrics.
    "AWS/ElastiCache": AwsNamespace(
        "https://docs.aws.amazon.com/AmazonElastiCache/latest/dg/serverless-metrics-events-redis.html",
        frozenset(
            {
                "BytesUsedForCache",
                "ElastiCacheProcessingUnits",
                "SuccessfulReadRequestLatency",
                "SuccessfulWriteRequestLatency",
                "TotalCmdsCount",
                "CacheHitRate",
                "CacheHits",
                "CurrConnections",
                "ThrottledCmds",
                "NewConnections",
                "CurrItems",
                "CurrVolatileItems",
                "NetworkBytesIn",
                "NetworkBytesOut",
                "Evictions",
            }
        ),
        {"clusterId": ("AWS::ElastiCache::ServerlessCache", None)},
    ),
}


# ---------------------------------------------------------------- what the code emits


def busy(cls: type, **given: Any) -> Any:
    """A report with every int counter at 1: every ``if report.x`` that guards a metric runs."""
    values = {f.name: 1 for f in fields(cls) if f.type == "int"}
    return cls(**{**values, **given})


class EveryVerdict(BatchReport):
    """A delivery batch that counts one of whatever verdict it is asked about."""

    def count(self, verdict_: str) -> int:
        return 1


def drive_trigger(monkeypatch: pytest.MonkeyPatch) -> None:
    lags = [0, 12, 140, 300, 700, 1_500, 2_500]  # late (> 100 ms) and every accuracy level
    report = busy(TriggerReport, lags_ms=lags, failures=["tmr:1: boom"])
    deps = SimpleNamespace(clock=lambda: 1_000)
    monkeypatch.setattr(trigger_app, "wired", lambda: (None, deps))
    monkeypatch.setattr(trigger_app, "run_trigger", lambda *_: report)
    event = json.loads((ROOT / "events" / "trigger.json").read_text())
    trigger_app.handler(event, LambdaContext(function_name="trigger"))


def drive_fanout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fanout_app, "deps", lambda: SimpleNamespace(clock=lambda: 1_000))
    monkeypatch.setattr(fanout_app, "run_fanout", lambda *_: busy(FanoutReport))
    fanout_app.handler({}, LambdaContext(function_name="fanout"))


def drive_migrator(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(migrator_app, "deps", lambda: SimpleNamespace(clock=lambda: 1_000))
    monkeypatch.setattr(migrator_app, "run_migrator", lambda *_: busy(MigrationReport))
    migrator_app.handler({}, LambdaContext(function_name="migrator"))


def drive_delivery(monkeypatch: pytest.MonkeyPatch) -> None:
    event = json.loads((ROOT / "events" / "delivery.json").read_text())
    report = EveryVerdict({r["messageId"]: Outcome("delivered") for r in event["Records"]})
    queues = SimpleNamespace(delivery_redrive_queue_url="https://sqs/123456789012/redrive")
    monkeypatch.setattr(delivery_app, "settings", lambda: queues)
    monkeypatch.setattr(delivery_app, "deps", lambda: None)
    monkeypatch.setattr(delivery_app, "deliver_batch", lambda *_: report)
    delivery_app.handler(event, LambdaContext(function_name="delivery"))


DRIVERS: dict[str, Callable[[pytest.MonkeyPatch], None]] = {
    "TriggerFunction": drive_trigger,
    "FanoutFunction": drive_fanout,
    "MigratorFunction": drive_migrator,
    "DeliveryFunction": drive_delivery,
}


def emf_blocks(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines() if '"_aws"' in line]


def emitted_metrics(blocks: list[dict[str, Any]]) -> Emitted:
    """(namespace, name, dimensions) of each metric, as CloudWatch extracts them from EMF."""
    found = set()
    for block in blocks:
        for directive in block["_aws"]["CloudWatchMetrics"]:
            for names in directive["Dimensions"]:
                dims = frozenset((n, block[n]) for n in names)
                for metric in directive["Metrics"]:
                    found.add((directive["Namespace"], metric["Name"], dims))
    return found


@pytest.fixture(scope="module")
def emitted() -> Iterator[Emitted]:
    with pytest.MonkeyPatch.context() as monkeypatch:
        capture = CapturedStdout()
        monkeypatch.setattr("sys.stdout", capture)
        for drive in DRIVERS.values():
            drive(monkeypatch)
        monkeypatch.undo()
        yield emitted_metrics(emf_blocks(capture.text()))


class CapturedStdout:
    def __init__(self) -> None:
        self._parts: list[str] = []

    def write(self, text: str) -> int:
        self._parts.append(text)
        return len(text)

    def flush(self) -> None:
        pass

    def text(self) -> str:
        return "".join(self._parts)


def test_every_function_that_emits_metrics_is_driven() -> None:
    """A function that starts emitting must be driven here, or its metrics go unchecked."""
    emitting = {
        logical_id
        for logical_id, props in template.resources("AWS::Serverless::Function").items()
        if any(
            re.search(r"add_metric|add_counts", source.read_text())
            for source in (ROOT / props["CodeUri"]).rglob("*.py")
        )
    }
    assert emitting == set(DRIVERS)


def test_the_functions_emit_in_the_templates_namespace(
    emitted: Emitted,
) -> None:
    service = ENV["POWERTOOLS_SERVICE_NAME"]
    assert {ns for ns, _, _ in emitted} == {NAMESPACE}
    assert {dims for _, _, dims in emitted} == {frozenset({("service", service)})}


def test_every_fire_is_one_lag_value_across_powertools_flushes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """p50/p99 of FireLagMs are per fire only if each fire's lag is one value (blocks hold 100)."""
    lags = [(i * 37) % 500 for i in range(250)]
    report = busy(TriggerReport, lags_ms=lags)
    trigger_app.emit_metrics(report, None)
    trigger_app.metrics.flush_metrics()
    blocks = emf_blocks(capsys.readouterr().out)
    values = [v for b in blocks for v in b.get("FireLagMs", [])]
    assert values == [float(lag) for lag in lags]
    assert max(len(b.get("FireLagMs", [])) for b in blocks) == 100
    assert [b["FiresEnqueued"] for b in blocks if "FiresEnqueued" in b] == [[1.0]]


def test_a_run_counts_its_sends_by_accuracy_level_and_only_the_levels_it_had(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """One count per level per run, from the same levels as usage (timers.core.lag), left out
    where zero like the other counts: they add up to the run's sends."""
    report = busy(TriggerReport, enqueued=5, lags_ms=[3, 200, 201, 2_000, 2_001])
    trigger_app.emit_metrics(report, None)
    trigger_app.metrics.flush_metrics()
    (block,) = emf_blocks(capsys.readouterr().out)
    levels = {k: v for k, v in block.items() if k.startswith("FiresLag_")}
    assert levels == {"FiresLag_1-200ms": [2.0], "FiresLag_200-600ms": [1.0],
                      "FiresLag_1000-2000ms": [1.0], "FiresLag_over_2000ms": [1.0]}  # fmt: skip


# ---------------------------------------------------------------- what the dashboard reads

_SUB = re.compile(r"\$\{([^}]+)\}")
_REF_MARK = "@ref:"


def resolve(body: str) -> Any:
    """The dashboard's JSON with parameters at their defaults and references marked."""

    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        if name in PARAMETERS:
            return str(PARAMETERS[name]["Default"])
        return _REF_MARK + name

    return json.loads(_SUB.sub(one, body))


def dimension_value(value: Any) -> str | Ref:
    if isinstance(value, template.Tag):
        if value.name == "Ref":
            return Ref(value.value)
        if value.name == "GetAtt":
            parts = value.value.split(".", 1) if isinstance(value.value, str) else value.value
            return Ref(parts[0], parts[1])
        raise AssertionError(f"unexpected dimension value {value}")
    if isinstance(value, str) and value.startswith(_REF_MARK):
        resource, _, attribute = value[len(_REF_MARK) :].partition(".")
        return Ref(resource, attribute or None)
    return str(value)


def dashboard_metrics(body: str) -> list[MetricUse]:
    uses = []
    for widget in resolve(body)["widgets"]:
        if widget["type"] != "metric":
            continue
        props = widget["properties"]
        for entry in props["metrics"]:
            if isinstance(entry[0], dict):  # a math expression over the other entries
                continue
            *parts, options = entry if isinstance(entry[-1], dict) else (*entry, {})
            assert "." not in parts, "write each metric out: the test does not expand '.'"
            namespace, name, *dims = parts
            pairs = tuple(zip(dims[::2], map(dimension_value, dims[1::2]), strict=True))
            where = f"widget {props['title']!r} ({options.get('label', name)})"
            uses.append(MetricUse(where, namespace, name, pairs))
    return uses


def alarm_metrics(alarms: dict[str, dict[str, Any]]) -> list[MetricUse]:
    uses = []
    for logical_id, props in alarms.items():
        stats = [props] if "MetricName" in props else []
        stats += [m["MetricStat"]["Metric"] for m in props.get("Metrics", []) if "MetricStat" in m]
        for stat in stats:
            pairs = tuple(
                (d["Name"], dimension_value(d["Value"])) for d in stat.get("Dimensions", [])
            )
            uses.append(
                MetricUse(f"alarm {logical_id}", stat["Namespace"], stat["MetricName"], pairs)
            )
    return uses


def problems(uses: list[MetricUse], emitted: Emitted) -> list[str]:
    """Why each metric use would stay empty; none when all is well."""
    found = []
    for use in uses:
        dims = dict(use.dimensions)
        if use.namespace == NAMESPACE:
            if any(isinstance(v, Ref) for v in dims.values()):
                found.append(f"{use.where}: {use.name} has a dimension the stack fills in")
            elif (use.namespace, use.name, frozenset(dims.items())) not in emitted:
                found.append(f"{use.where}: no code emits {use.name} with dimensions {dims}")
            continue
        aws = AWS_METRICS.get(use.namespace)
        if aws is None:
            found.append(f"{use.where}: namespace {use.namespace} is neither ours nor listed")
            continue
        if use.name not in aws.names:
            found.append(f"{use.where}: {use.namespace} publishes no {use.name} ({aws.source})")
        if set(dims) != set(aws.dimensions):
            found.append(f"{use.where}: {use.namespace} dimensions are {set(aws.dimensions)}")
            continue
        for dim, value in dims.items():
            kind, attribute = aws.dimensions[dim]
            resource = RESOURCES.get(value.resource) if isinstance(value, Ref) else None
            if (
                not isinstance(value, Ref)
                or resource is None
                or resource["Type"] != kind
                or value.attribute != attribute
            ):
                want = f"!GetAtt <{kind}>.{attribute}" if attribute else f"!Ref <{kind}>"
                found.append(f"{use.where}: {dim} must be {want}, got {value!r}")
    return found


def _dashboard_body() -> str:
    (dashboard,) = template.resources("AWS::CloudWatch::Dashboard").values()
    body = dashboard["DashboardBody"]
    assert isinstance(body, template.Tag) and body.name == "Sub"
    return str(body.value)


ALARMS = template.resources("AWS::CloudWatch::Alarm")


def test_every_metric_the_dashboard_reads_is_published(
    emitted: Emitted,
) -> None:
    uses = dashboard_metrics(_dashboard_body())
    assert {u.namespace for u in uses} == {NAMESPACE, *AWS_METRICS}  # the lists are all used
    assert problems(uses, emitted) == []


def test_every_metric_an_alarm_reads_is_published(
    emitted: Emitted,
) -> None:
    uses = alarm_metrics(ALARMS)
    assert {u.where for u in uses} == {f"alarm {a}" for a in ALARMS}  # each alarm reads one
    assert problems(uses, emitted) == []


@pytest.mark.parametrize(
    ("old", "new", "complaint"),
    [
        ('"FireLagMs"', '"FireLagP99Ms"', "no code emits FireLagP99Ms"),
        ('"Webhooks_failed"', '"WebhooksFailed"', "no code emits WebhooksFailed"),
        ('"FiresLag_over_2000ms"', '"FiresLag_over_2s"', "no code emits FiresLag_over_2s"),
        ('"service", "timers"', '"service", "timer"', "with dimensions {'service': 'timer'}"),
        ('"service", "timers"', '"function", "trigger"', "with dimensions {'function'"),
        ("${TriggerFunction}", "${TriggerLogGroup}", "FunctionName must be !Ref"),
        ("${DeliveryQueue.QueueName}", "${DeliveryQueue}", "QueueName must be !GetAtt"),
        ('"4xx"', '"4XXError"', "AWS/ApiGateway publishes no 4XXError"),
        ('"clusterId"', '"CacheClusterId"', "AWS/ElastiCache dimensions are {'clusterId'}"),
        ('"ThrottledCmds"', '"CPUUtilization"', "AWS/ElastiCache publishes no CPUUtilization"),
    ],
)
def test_a_dashboard_metric_nothing_publishes_is_caught(
    emitted: Emitted, old: str, new: str, complaint: str
) -> None:
    body = _dashboard_body()
    assert old in body
    found = problems(dashboard_metrics(body.replace(old, new, 1)), emitted)
    assert len(found) == 1 and complaint in found[0], found


@pytest.mark.parametrize(
    ("alarm", "key", "value", "complaint"),
    [
        ("FiresUnrecordedAlarm", "MetricName", "FireUnrecorded", "no code emits FireUnrecorded"),
        ("TriggerErrorsAlarm", "MetricName", "Error", "AWS/Lambda publishes no Error"),
        (
            "DeadLetterQueueAlarm",
            "Dimensions",
            [{"Name": "QueueName", "Value": template.Tag("Ref", "DeliveryDeadLetterQueue")}],
            "QueueName must be !GetAtt",
        ),
    ],
)
def test_an_alarm_metric_nothing_publishes_is_caught(
    emitted: Emitted, alarm: str, key: str, value: Any, complaint: str
) -> None:
    mutated = {alarm: {**ALARMS[alarm], key: value}}
    found = problems(alarm_metrics(mutated), emitted)
    assert len(found) == 1 and complaint in found[0], found


def test_the_lateness_widget_stacks_one_count_per_accuracy_level() -> None:
    (widget,) = [
        w for w in resolve(_dashboard_body())["widgets"]
        if w["type"] == "metric" and "lateness" in w["properties"]["title"]
    ]  # fmt: skip
    props = widget["properties"]
    assert props["stacked"] is True
    assert [m[1] for m in props["metrics"]] == [f"FiresLag_{level}" for level in LAG_LEVELS]
    assert {m[-1]["stat"] for m in props["metrics"]} == {"Sum"}


def test_no_two_widgets_overlap() -> None:
    taken: dict[tuple[int, int], str] = {}
    for widget in resolve(_dashboard_body())["widgets"]:
        title = widget["properties"]["title"]
        assert widget["x"] + widget["width"] <= 24, title
        for x in range(widget["x"], widget["x"] + widget["width"]):
            for y in range(widget["y"], widget["y"] + widget["height"]):
                assert (x, y) not in taken, (title, taken.get((x, y)))
                taken[(x, y)] = title


# ---------------------------------------------------------------- where the alarms go


def test_every_alarm_notifies_the_topic_and_unconditional_ones_are_on_the_dashboard() -> None:
    topic = template.Tag("Ref", "AlarmTopic")
    for logical_id, props in ALARMS.items():
        assert props["AlarmActions"] == [topic], logical_id
        assert props["OKActions"] == [topic], logical_id
    (widget,) = [w for w in resolve(_dashboard_body())["widgets"] if w["type"] == "alarm"]
    shown = {dimension_value(arn) for arn in widget["properties"]["alarms"]}
    unconditional = {a for a in ALARMS if "Condition" not in RESOURCES[a]}
    assert shown == {Ref(a, "Arn") for a in unconditional}

"""What the local stack runs, read from template.yaml: functions, HttpApi routes, schedules.

A function added to the template runs locally with no other change: its handler, code and
layers, environment (Globals merged, intrinsics resolved), timeout, memory, async-invoke
settings, HttpApi routes (payload format 2.0, the ``$default`` catch-all included) and
schedules all come from here. Resources resolve to their logical id
(the local table, queue and function names); parameters to samconfig.toml's overrides, else
their defaults - the values a deploy would use.
"""

from __future__ import annotations

import re
import shlex
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from ops import template
from ops.template import ROOT, Tag

ACCOUNT = "123456789012"  # moto's default account
DEFAULT_TIMEOUT_S = 3  # Lambda's defaults when neither the function nor Globals set one
DEFAULT_MEMORY_MB = 128
DEFAULT_ASYNC_RETRIES = 2
DEFAULT_EVENT_AGE_S = 21_600


class TemplateError(Exception):
    """The template uses something the local stack cannot run; the message says what."""


@dataclass(frozen=True)
class FunctionSpec:
    name: str  # logical id: the local function name
    module: str
    attr: str
    code_paths: tuple[str, ...]  # CodeUri first, then each layer's import root
    environment: dict[str, str]
    timeout_s: float
    memory_mb: int
    async_retries: int
    max_event_age_s: int
    reserved: int | None = None  # ReservedConcurrentExecutions: at most this many at once


DEFAULT_ROUTE = "$default"  # an HTTP API's catch-all route key
DEFAULT_STAGE = "$default"  # an HTTP API's stage served at the root of its URL


@dataclass(frozen=True)
class Route:
    """One route of an HTTP API: ``GET /v1/timers/{id}``, ``ANY /{proxy+}`` or ``$default``."""

    method: str  # upper case, or ANY
    path: str  # the template path, e.g. /v1/timers/{id}; $default for the catch-all
    function: str
    stage: str
    timeout_ms: int = 30_000  # TimeoutInMillis: the integration timeout (an HTTP API's default)

    @property
    def key(self) -> str:
        """The routeKey API Gateway puts in the event."""
        return DEFAULT_ROUTE if self.is_default else f"{self.method} {self.path}"

    @property
    def is_default(self) -> bool:
        return self.path == DEFAULT_ROUTE

    def match(self, method: str, path: str) -> dict[str, str] | None:
        """Path parameters if this route serves ``method path``, else None."""
        if self.is_default:
            return {}
        if self.method not in ("ANY", method):
            return None
        found = _path_pattern(self.path).fullmatch(path)
        return found.groupdict() if found else None

    def precedence(self) -> tuple[int, int, int, int, int]:
        """Sort key: the most specific route first, as API Gateway picks them. A route without
        path variables, then with {variables}, then greedy {proxy+}; a route's own method before
        ANY on the same path; the $default route last."""
        greedy = self.path.count("+}")
        return (
            int(self.is_default),
            greedy,
            self.path.count("{") - greedy,
            -len(self.path),
            int(self.method == "ANY"),
        )


@dataclass(frozen=True)
class ScheduleSpec:
    function: str
    name: str
    expression: str  # rate(...) or cron(...)
    input: str | None  # the event as JSON text, when the template fixes it


@dataclass(frozen=True)
class QueueSourceSpec:
    """An SQS event source: the local stack polls the queue as Lambda's poller would."""

    function: str
    name: str  # <function>.<event>
    queue_url: str
    queue_arn: str
    batch_size: int
    window_s: float  # MaximumBatchingWindowInSeconds
    report_failures: bool  # FunctionResponseTypes: [ReportBatchItemFailures]
    max_concurrency: int | None  # ScalingConfig.MaximumConcurrency


@dataclass(frozen=True)
class StackSpec:
    stack_name: str
    region: str
    functions: dict[str, FunctionSpec]
    routes: list[Route]  # most specific first
    schedules: list[ScheduleSpec]
    queue_sources: list[QueueSourceSpec] = field(default_factory=list)

    def route(self, method: str, path: str) -> tuple[Route, dict[str, str]] | None:
        """The route that serves ``method path`` and its path parameters; None when no route
        does and there is no $default route."""
        for route in self.routes:
            params = route.match(method, path)
            if params is not None:
                return route, params
        return None

    def function_arn(self, name: str) -> str:
        return f"arn:aws:lambda:{self.region}:{ACCOUNT}:function:{name}"


@cache
def _path_pattern(path: str) -> re.Pattern[str]:
    # {name} is one segment, {name+} (greedy proxy) the rest of the path.
    pattern = re.sub(r"\{(\w+)\+\}", r"(?P<\1>.+)", path)
    return re.compile(re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", pattern))


def samconfig(path: Path = ROOT / "samconfig.toml") -> dict[str, Any]:
    """stack_name, region and parameter overrides of samconfig.toml's default environment."""
    if not path.exists():
        return {}
    config = tomllib.loads(path.read_text()).get("default", {})
    deploy = config.get("deploy", {}).get("parameters", {})
    overrides = dict(
        token.split("=", 1) for token in shlex.split(deploy.get("parameter_overrides", ""))
    )
    return {
        "stack_name": config.get("global", {}).get("parameters", {}).get("stack_name"),
        "region": deploy.get("region"),
        "parameters": overrides,
    }


class Resolver:
    """Resolves the intrinsics function settings use (Ref, Sub, GetAtt, Join) to local values."""

    def __init__(
        self,
        doc: dict[str, Any],
        stack_name: str,
        region: str,
        params: dict[str, str],
        aws_endpoint: str,
    ) -> None:
        self._aws_endpoint = aws_endpoint
        self._resources: dict[str, Any] = doc.get("Resources", {})
        self._pseudo = {
            "AWS::StackName": stack_name,
            "AWS::Region": region,
            "AWS::AccountId": ACCOUNT,
            "AWS::Partition": "aws",
            "AWS::URLSuffix": "amazonaws.com",
        }
        self._params = {
            name: str(params.get(name, decl.get("Default", "")))
            for name, decl in doc.get("Parameters", {}).items()
        }
        self._region = region

    def __call__(self, value: Any) -> Any:
        if isinstance(value, Tag):
            handler = self._intrinsics.get(value.name)
            if handler is None:
                raise TemplateError(f"!{value.name} is not supported locally")
            return handler(self, value.value)
        if isinstance(value, list):
            return [self(v) for v in value]
        return value

    def _kind(self, name: str) -> str:
        kind: str = self._resources.get(name, {}).get("Type", "")
        return kind

    def properties(self, name: str) -> dict[str, Any]:
        props: dict[str, Any] = self._resources.get(name, {}).get("Properties", {})
        return props

    def ref(self, name: str) -> str:
        if name in self._pseudo:
            return self._pseudo[name]
        if name in self._params:
            return self._params[name]
        if self._kind(name) == "AWS::SQS::Queue":  # a queue's Ref is its URL
            fifo = ".fifo" if self.properties(name).get("FifoQueue") else ""
            return f"{self._aws_endpoint}/{ACCOUNT}/{name}{fifo}"
        if name in self._resources:
            return name  # every local table, queue and function is named by its logical id
        raise TemplateError(f"!Ref {name}: no such parameter or resource")

    def get_att(self, target: str | list[str]) -> str:
        name, attr = target.split(".", 1) if isinstance(target, str) else target
        kind = self._kind(name)
        if attr == "Arn" and kind in ("AWS::Serverless::Function", "AWS::Lambda::Function"):
            return f"arn:aws:lambda:{self._region}:{ACCOUNT}:function:{name}"
        if attr == "Arn" and kind == "AWS::DynamoDB::Table":
            return f"arn:aws:dynamodb:{self._region}:{ACCOUNT}:table/{name}"
        if kind == "AWS::SQS::Queue" and attr in ("Arn", "QueueName", "QueueUrl"):
            arn = f"arn:aws:sqs:{self._region}:{ACCOUNT}:{self.ref(name).rsplit('/', 1)[1]}"
            url = self.ref(name)
            return {"Arn": arn, "QueueName": url.rsplit("/", 1)[1], "QueueUrl": url}[attr]
        raise TemplateError(f"!GetAtt {name}.{attr} has no local equivalent")

    def sub(self, value: str | list[Any]) -> str:
        text, names = (value, {}) if isinstance(value, str) else (value[0], self(value[1]))

        def one(m: re.Match[str]) -> str:
            key = m.group(1)
            if key.startswith("!"):
                return "${" + key[1:] + "}"  # ${!Literal} is an escaped literal
            if key in names:
                return str(self(names[key]))
            return self.get_att(key) if "." in key else self.ref(key)

        return re.sub(r"\$\{([^}]+)\}", one, text)

    def join(self, value: list[Any]) -> str:
        delimiter, items = value
        return str(delimiter).join(str(self(v)) for v in self(items))

    _intrinsics: dict[str, Callable[[Resolver, Any], Any]] = {
        "Ref": ref,
        "Sub": sub,
        "GetAtt": get_att,
        "Join": join,
    }


def _function(
    name: str,
    props: dict[str, Any],
    globals_: dict[str, Any],
    resolve: Resolver,
    local_env: Mapping[str, str],
    root: Path,
) -> FunctionSpec:
    handler = props.get("Handler") or globals_.get("Handler")
    if not handler or "." not in handler or not props.get("CodeUri"):
        raise TemplateError(f"{name}: needs a CodeUri and a Handler like 'app.handler'")
    module, attr = handler.rsplit(".", 1)
    layers = [*globals_.get("Layers", []), *props.get("Layers", [])]  # SAM appends lists
    code_paths = [str(root / props["CodeUri"])]
    for layer in layers:
        code_paths.append(str(_layer_root(resolve, layer, root)))
    variables = {
        **globals_.get("Environment", {}).get("Variables", {}),
        **props.get("Environment", {}).get("Variables", {}),
    }
    environment = {}
    for key, value in variables.items():
        try:  # the local stack's replacements win, so e.g. the cache endpoint need not resolve
            environment[key] = local_env[key] if key in local_env else str(resolve(value))
        except TemplateError as exc:
            raise TemplateError(f"{name}: environment {key}: {exc}") from None
    invoke = props.get("EventInvokeConfig", {})
    return FunctionSpec(
        name=name,
        module=module,
        attr=attr,
        code_paths=tuple(code_paths),
        environment=environment,
        timeout_s=float(props.get("Timeout", globals_.get("Timeout", DEFAULT_TIMEOUT_S))),
        memory_mb=int(props.get("MemorySize", globals_.get("MemorySize", DEFAULT_MEMORY_MB))),
        async_retries=int(invoke.get("MaximumRetryAttempts", DEFAULT_ASYNC_RETRIES)),
        max_event_age_s=int(invoke.get("MaximumEventAgeInSeconds", DEFAULT_EVENT_AGE_S)),
        reserved=int(resolve(reserved))
        if (reserved := props.get("ReservedConcurrentExecutions")) is not None
        else None,
    )


def _layer_root(resolve: Resolver, layer: Any, root: Path) -> Path:
    """Where a layer's code imports from: ContentUri/python if the layer has one, else itself."""
    if not (isinstance(layer, Tag) and layer.name == "Ref"):
        raise TemplateError(f"layer {layer!r}: only layers of this template run locally")
    content = root / resolve.properties(layer.value).get("ContentUri", "")
    return content / "python" if (content / "python").is_dir() else content


def load_stack(
    local_env: Mapping[str, str],
    aws_endpoint: str = "http://127.0.0.1:4566",
    path: Path = template.TEMPLATE,
    concurrency: int | None = None,
) -> StackSpec:
    """The stack as template.yaml and samconfig.toml describe it, with ``local_env`` replacing
    the environment variables the local stack provides itself (e.g. the Redis endpoint), and
    queue URLs on ``aws_endpoint``. ``concurrency``: the local account's sandboxes per
    function - a function cannot reserve more, so a reserved concurrency above it is taken as
    it, and so is the parameter it comes from (which other functions may be told of)."""
    doc = template.load(path)
    config = samconfig(path.parent / "samconfig.toml")
    stack_name = config.get("stack_name") or "timers"
    region = config.get("region") or "us-east-1"
    params = dict(config.get("parameters", {}))
    if concurrency is not None:
        params |= _capped_reservations(doc, params, concurrency)
    resolve = Resolver(doc, stack_name, region, params, aws_endpoint)
    globals_ = doc.get("Globals", {}).get("Function", {})
    functions: dict[str, FunctionSpec] = {}
    routes: list[Route] = []
    schedules: list[ScheduleSpec] = []
    sources: list[QueueSourceSpec] = []
    apis = template.resources("AWS::Serverless::HttpApi", path)
    for name, props in template.resources("AWS::Serverless::Function", path).items():
        functions[name] = _function(name, props, globals_, resolve, local_env, path.parent)
        for event_name, event in props.get("Events", {}).items():
            p = event.get("Properties", {})
            if event["Type"] == "HttpApi":
                routes.append(_http_api_route(name, event_name, p, apis))
            elif event["Type"] == "Api":
                raise TemplateError(
                    f"{name}.{event_name}: REST API (Type: Api) events do not run locally; "
                    "the local gateway serves HttpApi events (payload format 2.0)"
                )
            elif event["Type"] in ("Schedule", "ScheduleV2"):
                if p.get("Enabled", True) is False or p.get("State") == "DISABLED":
                    continue
                expression = p.get("Schedule") or p.get("ScheduleExpression")
                rule = f"{name}.{event_name}"
                schedules.append(ScheduleSpec(name, rule, expression, p.get("Input")))
            elif event["Type"] == "SQS":
                if p.get("Enabled", True) is False:
                    continue
                sources.append(_queue_source(name, event_name, p, resolve))
    routes.sort(key=Route.precedence)
    return StackSpec(stack_name, region, functions, routes, schedules, sources)


def _capped_reservations(
    doc: dict[str, Any], params: Mapping[str, str], concurrency: int
) -> dict[str, str]:
    """The parameters functions reserve their concurrency from, capped at ``concurrency``."""
    declared = doc.get("Parameters", {})
    capped: dict[str, str] = {}
    for props in template.resources_of(doc, "AWS::Serverless::Function").values():
        reserved = props.get("ReservedConcurrentExecutions")
        if isinstance(reserved, Tag) and reserved.name == "Ref" and reserved.value in declared:
            value = int(params.get(reserved.value, declared[reserved.value].get("Default", 0)))
            capped[reserved.value] = str(min(value, concurrency))
    return capped


def _queue_source(
    function: str, event_name: str, props: dict[str, Any], resolve: Resolver
) -> QueueSourceSpec:
    where = f"{function}.{event_name}"
    queue = props.get("Queue")
    if not (isinstance(queue, Tag) and queue.name == "GetAtt"):
        raise TemplateError(f"{where}: Queue must be !GetAtt <a queue of the template>.Arn")
    name = queue.value.split(".")[0] if isinstance(queue.value, str) else queue.value[0]
    scaling = props.get("ScalingConfig", {}).get("MaximumConcurrency")
    return QueueSourceSpec(
        function=function,
        name=where,
        queue_url=resolve.ref(name),
        queue_arn=resolve.get_att(f"{name}.Arn"),
        batch_size=int(props.get("BatchSize", 10)),
        window_s=float(props.get("MaximumBatchingWindowInSeconds", 0)),
        report_failures="ReportBatchItemFailures" in props.get("FunctionResponseTypes", []),
        max_concurrency=int(resolve(scaling)) if scaling is not None else None,
    )


def _http_api_route(
    function: str, event_name: str, props: dict[str, Any], apis: dict[str, dict[str, Any]]
) -> Route:
    """An HttpApi event as a route. Without Path and Method it is the $default route, as SAM
    makes it; without ApiId it belongs to SAM's implicit API (stage $default)."""
    where = f"{function}.{event_name}"
    version = str(props.get("PayloadFormatVersion", "2.0"))
    if version != "2.0":
        raise TemplateError(f"{where}: payload format {version}; the local gateway speaks 2.0")
    api = props.get("ApiId")
    api_name = api.value if isinstance(api, Tag) and api.name == "Ref" else None
    if api is not None and api_name not in apis:
        raise TemplateError(f"{where}: ApiId must !Ref an AWS::Serverless::HttpApi of the template")
    stage = apis.get(api_name or "", {}).get("StageName") or DEFAULT_STAGE
    if not isinstance(stage, str):
        raise TemplateError(f"{where}: the HttpApi's StageName must be a plain string locally")
    route_path = props.get("Path") or DEFAULT_ROUTE
    method = str(props.get("Method") or "ANY").upper()
    if method == "X-AMAZON-APIGATEWAY-ANY-METHOD":
        method = "ANY"
    timeout = props.get("TimeoutInMillis", 30_000)
    if isinstance(timeout, bool) or not isinstance(timeout, int) or not 50 <= timeout <= 30_000:
        raise TemplateError(f"{where}: TimeoutInMillis must be a number from 50 to 30000")
    return Route(method, route_path, function, stage, timeout)

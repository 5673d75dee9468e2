"""HTTP API (API Gateway HTTP API, payload format 2.0 -> Lambda). Thin: parse, call the
service, map errors.

Every failure leaves as the contract's error body: ``{"error": {"code", "message", "details"}}``
- unknown routes and methods too: the HTTP API sends every request no route of the template
serves to this function (its ``$default`` route), and HTTP APIs have no gateway responses.
"""

from __future__ import annotations

import base64
import json
from functools import cache
from http import HTTPStatus
from typing import Annotated, Any

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.event_handler import APIGatewayHttpResolver, Response, content_types
from aws_lambda_powertools.event_handler.api_gateway import Route
from aws_lambda_powertools.event_handler.exceptions import NotFoundError
from aws_lambda_powertools.event_handler.openapi.exceptions import (
    RequestUnsupportedContentType,
    RequestValidationError,
)
from aws_lambda_powertools.event_handler.openapi.models import APIKey, OpenAPI
from aws_lambda_powertools.event_handler.openapi.params import Query
from aws_lambda_powertools.logging import correlation_paths
from aws_lambda_powertools.utilities.data_classes import APIGatewayProxyEventV2
from aws_lambda_powertools.utilities.typing import LambdaContext

from timers import http_models as m
from timers.adapters.tenants import Tenant, summary
from timers.core.errors import DomainError, FieldError, PayloadTooLarge, RateLimited, Unauthorized
from timers.core.timer import STATUSES, serialize_payload
from timers.runtime import DAY_MS, Runtime, build_runtime

logger = Logger()
tracer = Tracer()
metrics = Metrics()
app = APIGatewayHttpResolver(enable_validation=True)

BODY_LIMIT_BYTES = 256 * 1024
PUBLIC_PATHS = frozenset({"/v1/health", "/v1/openapi.json"})
StatusFilter = Annotated[str | None, Query(description="active | paused | completed")]
Limit = Annotated[int, Query(ge=1, le=100)]
_ERROR_CONTENT = {"application/json": {"model": m.ErrorOut}}
_WHEN = {
    400: "validation_error: malformed JSON, unknown fields, bad values; `details` names each field",
    401: "unauthorized: missing or unknown x-api-key",
    404: "not_found: no such timer for this tenant, or no such route",
    405: "method_not_allowed: the path does not serve this method; `Allow` lists those it does",
    409: "idempotency_conflict or invalid_state",
    413: "payload_too_large: payload over 64 KiB or request body over 256 KiB",
    415: "unsupported_media_type: the body is not sent as JSON (Content-Type: application/json)",
    429: "rate_limited: the tenant is over its request rate",
}
_ALLOW = {"Allow": {"description": "The methods this path serves", "schema": {"type": "string"}}}


def errors(*statuses: int) -> dict[int, Any]:
    """OpenAPI responses of the contract's error body, one per status."""
    return {
        status: {
            "description": _WHEN[status],
            "content": _ERROR_CONTENT,
            **({"headers": _ALLOW} if status == 405 else {}),
        }
        for status in statuses
    }


# Every operation: 405 for the other methods of its path. Operations that take a JSON body: 415.
ERRORS = errors(400, 401, 404, 405, 409, 413, 429)
BODY_ERRORS = errors(400, 401, 404, 405, 409, 413, 415, 429)


@cache
def runtime() -> Runtime:
    """Clients and settings, built once per cold start (not at import)."""
    return build_runtime()


def tenant() -> Tenant:
    current: Tenant = app.context["tenant"]
    return current


# ---------------------------------------------------------------- routes


@app.get("/v1/health", summary="Liveness", security=[], responses=errors(405))
def health() -> dict[str, str]:
    return {"status": "ok"}


@app.get(
    "/v1/openapi.json",
    summary="This OpenAPI document",
    security=[],
    responses={
        200: {
            "description": "The OpenAPI 3 document, generated from the code",
            "content": {"application/json": {"schema": {"type": "object"}}},
        },
        **errors(405),
    },
)
def openapi() -> Response[str]:
    return Response(
        status_code=200,
        content_type=content_types.APPLICATION_JSON,
        body=openapi_document(),
    )


@app.get("/v1/tenant", responses=ERRORS, summary="Who am I")
def who_am_i() -> m.TenantOut:
    retention_days = runtime().service.retention_ms // DAY_MS
    return m.TenantOut(**summary(tenant()), retention_days=retention_days)


@app.post("/v1/timers", responses=BODY_ERRORS, summary="Create a timer")
def create_timer(body: m.TimerCreate) -> Response[m.TimerOut]:
    key = app.current_event.headers.get("Idempotency-Key")
    spec = m.to_spec(body, serialize_payload(body.payload))
    view = runtime().service.create(tenant(), spec, key or None)
    return _json(HTTPStatus.CREATED, view)


@app.post(
    "/v1/timers:batch",
    responses=BODY_ERRORS,
    summary="Create up to 100 timers at once, all or nothing",
)
def create_timers(body: m.TimerBatchIn) -> Response[m.TimerBatchOut]:
    key = app.current_event.headers.get("Idempotency-Key")
    specs = [m.to_spec(t, serialize_payload(t.payload, f"timers[{i}].payload"))
             for i, t in enumerate(body.timers)]  # fmt: skip
    views = runtime().service.create_batch(tenant(), specs, key or None)
    return _json(HTTPStatus.CREATED, {"items": views})


@app.get("/v1/timers", responses=ERRORS, summary="List timers")
def list_timers(
    status: StatusFilter = None, limit: Limit = 50, cursor: Annotated[str | None, Query()] = None
) -> m.TimerList:
    if status is not None and status not in STATUSES:
        raise m.InvalidInput("invalid status", [FieldError("status", f"one of {STATUSES}")])
    return m.TimerList(**runtime().service.list(tenant(), status, limit, cursor))


@app.get("/v1/timers/<timer_id>", responses=ERRORS, summary="Get a timer")
def get_timer(timer_id: str) -> m.TimerOut:
    return m.TimerOut(**runtime().service.get(tenant(), timer_id))


@app.patch(
    "/v1/timers/<timer_id>",
    responses=BODY_ERRORS,
    summary="Update a timer; its next fire is recomputed",
)
def patch_timer(timer_id: str, body: m.TimerPatch) -> m.TimerOut:
    payload = serialize_payload(body.payload) if "payload" in body.model_fields_set else None
    changes = m.to_changes(body, payload)
    return m.TimerOut(**runtime().service.patch(tenant(), timer_id, changes))


@app.delete(
    "/v1/timers/<timer_id>", responses=ERRORS, summary="Cancel a timer: it never fires again"
)
def delete_timer(timer_id: str) -> Response[None]:
    runtime().service.delete(tenant(), timer_id)
    return Response(status_code=HTTPStatus.NO_CONTENT, body=None)


@app.post("/v1/timers/<timer_id>/pause", responses=ERRORS, summary="Pause: no fires while paused")
def pause_timer(timer_id: str) -> m.TimerOut:
    return m.TimerOut(**runtime().service.pause(tenant(), timer_id))


@app.post(
    "/v1/timers/<timer_id>/resume",
    responses=ERRORS,
    summary="Resume; missed fires follow `misfire`",
)
def resume_timer(timer_id: str) -> m.TimerOut:
    return m.TimerOut(**runtime().service.resume(tenant(), timer_id))


@app.get("/v1/timers/<timer_id>/fires", responses=ERRORS, summary="A timer's fires, newest first")
def list_fires(
    timer_id: str, limit: Limit = 50, cursor: Annotated[str | None, Query()] = None
) -> m.FireList:
    return m.FireList(**runtime().service.fire_history(tenant(), timer_id, limit, cursor))


@app.post(
    "/v1/schedule-preview",
    responses=BODY_ERRORS,
    summary="The next fire times of a schedule; creates nothing",
)
def schedule_preview(body: m.PreviewIn) -> m.PreviewOut:
    service = runtime().service
    return m.PreviewOut(**service.preview(m.to_plan(body, service.clock()), body.count))


# ---------------------------------------------------------------- errors, in one place


def _json(status: int, body: Any) -> Response[Any]:
    return Response(status_code=status, content_type=content_types.APPLICATION_JSON, body=body)


def error_response(
    status: int, code: str, message: str, details: list[FieldError] | None = None
) -> Response[Any]:
    body = {
        "error": {
            "code": code,
            "message": message,
            "details": [{"field": d.field, "message": d.message} for d in details or []],
        }
    }
    return _json(status, body)


@app.exception_handler(DomainError)
def domain_error(exc: DomainError) -> Response[Any]:
    return error_response(exc.status, exc.code, exc.message, exc.details)


@app.exception_handler(RequestValidationError)
def request_invalid(exc: RequestValidationError) -> Response[Any]:
    details = [_field_error(e) for e in exc.errors()]
    return error_response(400, "validation_error", "the request is invalid", details)


@app.exception_handler(RequestUnsupportedContentType)
def unsupported_content_type(exc: RequestUnsupportedContentType) -> Response[Any]:
    # The preflight answers a body that is not JSON first; this is the framework's own check.
    return _unsupported_media_type(app.current_event.headers.get("content-type", ""))


@app.not_found
def route_not_found(exc: NotFoundError) -> Response[Any]:
    # The preflight answers unknown routes and methods first; this covers a path it lets
    # through that no handler's pattern accepts.
    event = app.current_event
    return route_error(event.http_method.upper(), event.path)


def route_error(method: str, path: str) -> Response[Any]:
    """404 for a path the API does not have; 405 with ``Allow`` for a method it does not
    serve on a path it has."""
    allowed = route_methods(path)
    if not allowed or method in allowed:
        return error_response(404, "not_found", "no such route")
    allow = ", ".join(sorted(allowed, key=_method_rank))
    response = error_response(
        405, "method_not_allowed", f"{method} is not allowed on {path}; it allows {allow}"
    )
    response.headers["Allow"] = allow
    return response


def _unsupported_media_type(content_type: str) -> Response[Any]:
    return error_response(
        415,
        "unsupported_media_type",
        f"the body's Content-Type is {content_type!r}; send JSON with "
        "Content-Type: application/json",
        [FieldError("content-type", "must be application/json")],
    )


@app.exception_handler(Exception)
def unexpected(exc: Exception) -> Response[Any]:
    logger.exception("unhandled error")
    return error_response(500, "internal_error", "internal error; it has been logged")


_UNION_TAGS = {"at", "after", "cron", "every"}


def _field_error(error: dict[str, Any]) -> FieldError:
    """Pydantic's location -> the contract's dotted field name (``schedule.expression``)."""
    loc = [str(part) for part in error.get("loc", ())]
    if loc and loc[0] in {"body", "query", "path", "header"}:
        loc = loc[1:]
    parts: list[str] = []
    for i, part in enumerate(loc):
        if part in _UNION_TAGS and i > 0 and loc[i - 1] == "schedule":
            continue  # the discriminated union's tag
        if part.isdigit() and parts:
            parts[-1] += f"[{part}]"  # timers[3].schedule
        else:
            parts.append(part)
    if error.get("type") == "json_invalid":
        return FieldError("body", "malformed JSON")
    message = str(error.get("msg") or error.get("type", "invalid value"))
    if error.get("type") == "extra_forbidden":
        message = "unknown field"
    return FieldError(".".join(parts) or "body", message)


@cache
def openapi_schema() -> OpenAPI:
    schema = app.get_openapi_schema(
        title="Timer service",
        version="1.0.0",
        description=(
            "Second-precision timers that call back to SQS. See README.md. Every error has the "
            'body {"error": {"code", "message", "details"}}; a method a path does not serve is '
            "405 method_not_allowed (the Allow header lists those it does), an unknown path "
            "404 not_found."
        ),
        security_schemes={"apiKey": APIKey.model_validate({"in": "header", "name": "x-api-key"})},
        security=[{"apiKey": []}],
    )
    for path in PUBLIC_PATHS:  # the framework drops an operation's empty security list
        if schema.paths and (item := schema.paths.get(path)) and item.get:
            item.get.security = []
    return schema


@cache
def openapi_document() -> str:
    return openapi_schema().model_dump_json(by_alias=True, exclude_none=True, indent=2)


# ---------------------------------------------------------------- routes and methods

_METHOD_ORDER = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE")


def _method_rank(method: str) -> tuple[int, str]:
    order = _METHOD_ORDER.index(method) if method in _METHOD_ORDER else len(_METHOD_ORDER)
    return order, method


def route_methods(path: str) -> dict[str, Route]:
    """The methods the API serves on ``path`` (empty: no such path), each with its route.

    Read from the resolver's own routes (powertools has no public accessor for them), so this
    matches paths exactly as its router does; the tests check it against the OpenAPI document.
    """
    methods: dict[str, Route] = {}
    for route in (*app._static_routes, *app._dynamic_routes):
        if route.method not in methods and route.rule.match(path):
            methods[route.method] = route
    return methods


def is_json(content_type: str) -> bool:
    """application/json or any */*+json type; parameters (charset=...) do not matter."""
    media = content_type.split(";", 1)[0].strip().lower()
    main, _, sub = media.partition("/")
    return media == "application/json" or (bool(main) and sub.endswith("+json"))


# ---------------------------------------------------------------- entry point


def _raw_body(event: dict[str, Any]) -> bytes:
    body = event.get("body") or ""
    return base64.b64decode(body) if event.get("isBase64Encoded") else body.encode()


def _preflight(event: dict[str, Any]) -> Response[Any] | dict[str, Any]:
    """Checks that come before the handler and body validation: size, encoding, route and
    method, key, rate, content type. A rejection, or the event to resolve."""
    raw = _raw_body(event)
    if len(raw) > BODY_LIMIT_BYTES:
        return domain_error(PayloadTooLarge(f"request body is over {BODY_LIMIT_BYTES} bytes"))
    try:
        raw.decode()
    except UnicodeDecodeError:  # JSON is UTF-8; anything else is malformed, not a crash
        return domain_error(m.InvalidInput("malformed JSON", [FieldError("body", "not UTF-8")]))
    request = APIGatewayProxyEventV2(event)
    method, path = request.http_method.upper(), request.path
    methods = route_methods(path)
    if method not in methods:  # like the gateway before it: no key needed to learn this
        return route_error(method, path)
    if path not in PUBLIC_PATHS:
        caller = runtime().authenticate(request.headers.get("x-api-key"))
        if caller is None:
            return domain_error(Unauthorized("missing or unknown x-api-key"))
        if not runtime().rate_limiter.allow(caller.name, caller.rate_limit_per_s):
            return domain_error(RateLimited("tenant request rate exceeded; retry shortly"))
        app.append_context(tenant=caller)
        logger.append_keys(tenant=caller.name)
    content_type = request.headers.get("content-type")
    if content_type and methods[method].dependant.body_params:  # it takes a JSON body
        if not is_json(content_type):
            return _unsupported_media_type(content_type)
        # Accepted as JSON; the framework parses only a literal application/json as JSON.
        headers = {k: v for k, v in event["headers"].items() if k.lower() != "content-type"}
        event = {**event, "headers": {**headers, "content-type": "application/json"}}
    return event


def _proxy(response: Response[Any]) -> dict[str, Any]:
    """A preflight answer as a payload format 2.0 result."""
    body = response.body if isinstance(response.body, str) else json.dumps(response.body)
    headers = {"Content-Type": content_types.APPLICATION_JSON}
    for name, value in response.headers.items():
        headers[name] = value if isinstance(value, str) else ", ".join(value)
    return {
        "statusCode": response.status_code,
        "headers": headers,
        "body": body,
        "isBase64Encoded": False,
    }


@logger.inject_lambda_context(correlation_id_path=correlation_paths.API_GATEWAY_HTTP)
@tracer.capture_lambda_handler
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    app.context.clear()
    checked = _preflight(event)
    if isinstance(checked, Response):
        return _proxy(checked)
    return app.resolve(checked, context)

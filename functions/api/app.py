"""HTTP API (API Gateway HTTP API, payload format 2.0 -> Lambda). Thin: parse, call the
service, map errors.

Every failure leaves as the contract's error body: ``{"error": {"code", "message", "details"}}``
- unknown routes and methods too: the HTTP API sends every request no route of the template
serves to this function (its ``$default`` route), and HTTP APIs have no gateway responses.
"""

from __future__ import annotations

import base64
import json
import re
import traceback
from collections.abc import Mapping
from functools import cache
from http import HTTPStatus
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import unquote

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.event_handler import APIGatewayHttpResolver, Response, content_types
from aws_lambda_powertools.event_handler.api_gateway import Route
from aws_lambda_powertools.event_handler.exceptions import NotFoundError
from aws_lambda_powertools.event_handler.openapi import swagger_ui
from aws_lambda_powertools.event_handler.openapi.exceptions import (
    RequestUnsupportedContentType,
    RequestValidationError,
)
from aws_lambda_powertools.event_handler.openapi.models import APIKey, OpenAPI
from aws_lambda_powertools.event_handler.openapi.params import Header, Query
from aws_lambda_powertools.logging import correlation_paths
from aws_lambda_powertools.utilities.data_classes import APIGatewayProxyEventV2
from aws_lambda_powertools.utilities.typing import LambdaContext

from timers import http_models as m
from timers.adapters.tenants import Tenant, summary
from timers.core import strict_json
from timers.core.errors import DomainError, FieldError, PayloadTooLarge, RateLimited, Unauthorized
from timers.core.timer import serialize_payload
from timers.core.times import parse_ms
from timers.runtime import DAY_MS, Runtime, build_runtime

logger = Logger()
tracer = Tracer()
metrics = Metrics()
# Bodies are parsed once, strictly: NaN, lone surrogates, deep nesting are a 400 (strict_json).
app = APIGatewayHttpResolver(enable_validation=True, json_body_deserializer=strict_json.loads)

BODY_LIMIT_BYTES = 256 * 1024
RETRY_AFTER_S = 1  # the rate limiter's window is one second (timers.adapters.ratelimit)
KEY_LOOKUPS_PER_S = 10
"""Keys no api sandbox remembers, looked up per second and source address: each costs a read of
the tenants table, so made-up keys are refused before they reach it."""
DOCS_ASSETS = {  # Swagger UI, as the aws-lambda-powertools package ships it (offline)
    "/v1/docs/swagger-ui-bundle.js": ("swagger-ui-bundle.min.js", "application/javascript"),
    "/v1/docs/swagger-ui.css": ("swagger-ui.min.css", "text/css"),
}
CONSOLE_FILES = {  # the tenant console: static files of functions/api/console/, packaged with this
    "/v1/console": ("index.html", "text/html; charset=utf-8"),
    "/v1/console/console.js": ("console.js", "text/javascript; charset=utf-8"),
    "/v1/console/console.css": ("console.css", "text/css; charset=utf-8"),
}
PUBLIC_PATHS = frozenset(
    {"/v1/health", "/v1/openapi.json", "/v1/docs", *DOCS_ASSETS, *CONSOLE_FILES}
)
StatusFilter = Annotated[
    Literal["active", "paused", "completed"] | None,
    Query(description="Only timers in this status"),
]
Limit = Annotated[int, Query(ge=1, le=100, description="Page size")]
FireStatusFilter = Annotated[
    Literal["failed"], Query(description="Which fires: `failed` (the only one for now)")
]
Since = Annotated[
    m.Rfc3339 | None, Query(description="Only fires that failed at or after this instant")
]
Until = Annotated[
    m.Rfc3339 | None, Query(description="Only fires that failed at or before this instant")
]
Cursor = Annotated[
    str | None, Query(max_length=2048, description="`next_cursor` of the previous page")
]
IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        min_length=1,
        max_length=256,
        description="The same key and body within 24 h return the first response, create nothing",
    ),
]
_ERROR_CONTENT = {"application/json": {"model": m.ErrorOut}}
_WHEN = {
    400: "validation_error: malformed JSON, unknown fields, bad values; `details` names each field",
    401: "unauthorized: missing or unknown x-api-key",
    404: "not_found: no such timer for this tenant",
    405: "method_not_allowed: the path does not serve this method; `Allow` lists those it does",
    409: "invalid_state (pause/resume of a completed timer; redelivery of a fire that is not "
    "failed), concurrent_update (the timer kept changing under the request: retry)",
    413: "payload_too_large: payload over 64 KiB or request body over 256 KiB",
    415: "unsupported_media_type: the body is not sent as JSON (Content-Type: application/json)",
    429: "rate_limited: the tenant is over its request rate; retry after `Retry-After` seconds. "
    "(Over the stage-wide safety throttle, API Gateway itself answers 429 "
    '`{"message":"Too Many Requests"}`.)',
}
_HEADERS: dict[int, dict[str, Any]] = {
    405: {"Allow": {"description": "The methods this path serves", "schema": {"type": "string"}}},
    429: {
        "Retry-After": {
            "description": "Seconds until the tenant's rate window reopens",
            "schema": {"type": "integer", "minimum": 1},
        }
    },
}


def errors(*statuses: int) -> dict[int, Any]:
    """OpenAPI responses of the contract's error body, one per status."""
    return {
        status: {
            "description": _WHEN[status],
            "content": _ERROR_CONTENT,
            **({"headers": _HEADERS[status]} if status in _HEADERS else {}),
        }
        for status in statuses
    }


def ok(status: int, description: str, model: type | None = None, **more: Any) -> dict[int, Any]:
    """The success response of an operation (no body when ``model`` is None: 204)."""
    content = {} if model is None else {"content": {"application/json": {"model": model}}}
    return {status: {"description": description, **content, **more}}


# Which errors each kind of route can give. Every route: 405 for the other methods of its
# path; a route that needs a key: 401 and 429; a route that takes a JSON body: 400, 413 and 415.
KEYED = (401, 405, 429)
BODY = (*KEYED, 400, 413, 415)
ONE_TIMER = (*KEYED, 404)


@cache
def runtime() -> Runtime:
    """Clients and settings, built once per cold start (not at import)."""
    return build_runtime()


def tenant() -> Tenant:
    current: Tenant = app.context["tenant"]
    return current


# ---------------------------------------------------------------- routes


@app.get(
    "/v1/health",
    summary="Liveness",
    security=[],
    responses={**ok(200, "The service answers", m.HealthOut), **errors(405)},
)
def health() -> m.HealthOut:
    return m.HealthOut(status="ok")


@app.get(
    "/v1/openapi.json",
    summary="This OpenAPI document",
    security=[],
    responses={
        200: {
            "description": "The OpenAPI 3.1 document, generated from the code",
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


@app.get("/v1/tenant", responses={**ok(200, "The caller's tenant", m.TenantOut), **errors(*KEYED)},
         summary="Who am I")  # fmt: skip
def who_am_i() -> m.TenantOut:
    retention_days = runtime().service.changes.retention_ms // DAY_MS
    return m.TenantOut(**summary(tenant()), retention_days=retention_days)


@app.post(
    "/v1/timers",
    responses={
        **ok(201, "The timer (or, for a repeated Idempotency-Key, the first one)", m.TimerOut),
        **errors(*BODY, 409),
    },
    summary="Create a timer",
)
def create_timer(
    body: m.TimerCreate, idempotency_key: IdempotencyKey = None
) -> Response[m.TimerOut]:
    spec = m.to_spec(body, serialize_payload(body.payload))
    view = runtime().service.create(tenant(), spec, idempotency_key)
    return _json(HTTPStatus.CREATED, view)


@app.post(
    "/v1/timers:batch",
    responses={
        **ok(201, "The timers, in the order of the request", m.TimerBatchOut),
        **errors(*BODY, 409),
    },
    summary="Create up to 100 timers at once, all or nothing",
)
def create_timers(
    body: m.TimerBatchIn, idempotency_key: IdempotencyKey = None
) -> Response[m.TimerBatchOut]:
    views = runtime().service.create_batch(tenant(), m.to_specs(body), idempotency_key)
    return _json(HTTPStatus.CREATED, {"items": views})


@app.get(
    "/v1/timers",
    responses={
        **ok(
            200,
            "A page of the tenant's timers, by id. One request reads at most 1,000 "
            "timers: a page filtered by `status` can be short, even empty, with a "
            "`next_cursor` to go on from; the listing ends where `next_cursor` is null",
            m.TimerList,
        ),
        **errors(*KEYED, 400),
    },
    summary="List timers",
)
def list_timers(
    status: StatusFilter = None, limit: Limit = 50, cursor: Cursor = None
) -> m.TimerList:
    return m.TimerList(**runtime().service.list(tenant(), status, limit, cursor))


@app.get(
    "/v1/timers/<timer_id>",
    responses={**ok(200, "The timer", m.TimerOut), **errors(*ONE_TIMER)},
    summary="Get a timer",
)
def get_timer(timer_id: str) -> m.TimerOut:
    return m.TimerOut(**runtime().service.get(tenant(), timer_id))


@app.patch(
    "/v1/timers/<timer_id>",
    responses={**ok(200, "The changed timer", m.TimerOut), **errors(*BODY, 404, 409)},
    summary="Update a timer; its next fire is recomputed",
)
def patch_timer(timer_id: str, body: m.TimerPatch) -> m.TimerOut:
    payload = serialize_payload(body.payload) if "payload" in body.model_fields_set else None
    changes = m.to_changes(body, payload)
    return m.TimerOut(**runtime().service.patch(tenant(), timer_id, changes))


@app.delete(
    "/v1/timers/<timer_id>",
    responses={
        **ok(204, "Cancelled: it never fires again; a later GET is 404"),
        **errors(*ONE_TIMER, 409),
    },
    summary="Cancel a timer: it never fires again",
)
def delete_timer(timer_id: str) -> Response[None]:
    runtime().service.delete(tenant(), timer_id)
    return Response(status_code=HTTPStatus.NO_CONTENT, body=None)


@app.post(
    "/v1/timers/<timer_id>/pause",
    responses={**ok(200, "The timer, paused", m.TimerOut), **errors(*ONE_TIMER, 409)},
    summary="Pause: no fires while paused",
)
def pause_timer(timer_id: str) -> m.TimerOut:
    return m.TimerOut(**runtime().service.pause(tenant(), timer_id))


@app.post(
    "/v1/timers/<timer_id>/resume",
    responses={**ok(200, "The timer, active", m.TimerOut), **errors(*ONE_TIMER, 409)},
    summary="Resume; missed fires follow `misfire`",
)
def resume_timer(timer_id: str) -> m.TimerOut:
    return m.TimerOut(**runtime().service.resume(tenant(), timer_id))


@app.get(
    "/v1/timers/<timer_id>/fires",
    responses={**ok(200, "A page of the timer's fires", m.FireList), **errors(*ONE_TIMER, 400)},
    summary="A timer's fires, newest first",
)
def list_fires(timer_id: str, limit: Limit = 50, cursor: Cursor = None) -> m.FireList:
    return m.FireList(**runtime().service.fire_history(tenant(), timer_id, limit, cursor))


@app.get(
    "/v1/fires",
    responses={
        **ok(
            200,
            "A page of the tenant's failed fires (HTTP targets whose delivery gave up: at once, "
            "after the retry budget, waiting for a slot, or dead-lettered), newest first; a "
            "redelivered one stays listed with `redelivered_at`",
            m.FailedFireList,
        ),
        **errors(*KEYED, 400),
    },
    summary="The tenant's failed fires, newest first",
)
def list_failed_fires(
    status: FireStatusFilter,
    since: Since = None,
    until: Until = None,
    limit: Limit = 50,
    cursor: Cursor = None,
) -> m.FailedFireList:
    window = (
        None if since is None else parse_ms(since),
        None if until is None else parse_ms(until),
    )
    return m.FailedFireList(**runtime().failures.list_failed(tenant(), *window, limit, cursor))


@app.post(
    "/v1/timers/<timer_id>/fires/<fire_id>/redeliver",
    responses={
        **ok(
            202,
            "Redelivered: its message (same body, same fire id, so consumers still dedupe on "
            "webhook-id) is on the delivery queue again, for the timer's target as it is now, "
            "with a new retry budget from now; the fire's history shows it enqueued again",
            m.FailedFireOut,
        ),
        **errors(*ONE_TIMER, 409),
    },
    summary="Redeliver one failed fire",
)
def redeliver_fire(timer_id: str, fire_id: str) -> Response[m.FailedFireOut]:
    view = runtime().failures.redeliver(tenant(), timer_id, unquote(fire_id))
    return _json(HTTPStatus.ACCEPTED, view)


@app.post(
    "/v1/timers/<timer_id>/fires:redeliver",
    responses={
        **ok(
            202,
            "Every failed fire of the timer not redelivered yet, redelivered: at most 100 per "
            "request (the newest; call again for more), found among the tenant's newest 10,000 "
            "failures",
            m.FailedFireBatchOut,
        ),
        **errors(*ONE_TIMER),
    },
    summary="Redeliver every failed fire of a timer",
)
def redeliver_fires(timer_id: str) -> Response[m.FailedFireBatchOut]:
    return _json(HTTPStatus.ACCEPTED, runtime().failures.redeliver_all(tenant(), timer_id))


@app.post(
    "/v1/schedule-preview",
    responses={**ok(200, "The next fire times", m.PreviewOut), **errors(*BODY)},
    summary="The next fire times of a schedule; creates nothing",
)
def schedule_preview(body: m.PreviewIn) -> m.PreviewOut:
    service = runtime().service
    return m.PreviewOut(**service.preview(m.to_plan(body, service.clock()), body.count))


# ---------------------------------------------------------------- the docs page (no key)


@app.get(
    "/v1/docs",
    summary="This API as an interactive page (Swagger UI)",
    security=[],
    tags=["docs"],
    responses={
        200: {"description": "HTML", "content": {"text/html": {"schema": {"type": "string"}}}},
        **errors(405),
    },
)
def docs_page() -> Response[str]:
    return Response(status_code=200, content_type="text/html; charset=utf-8", body=DOCS_HTML,
                    headers={"Cache-Control": "no-cache"})  # fmt: skip


def _file_route(
    path: str,
    directory: Path,
    filename: str,
    media: str,
    *,
    kind: str,
    tag: str,
    summary: str,
    headers: Mapping[str, str],
) -> None:
    """``GET path``: a static file shipped with the function, public (no key), compressed; its
    operationId ``<kind>_<path>_get``."""
    declared = media.split(";", 1)[0]

    @app.get(
        path,
        summary=summary,
        security=[],
        tags=[tag],
        compress=True,
        operation_id=kind + re.sub(r"[/.-]", "_", path) + "_get",
        responses={
            200: {"description": filename, "content": {declared: {"schema": {"type": "string"}}}},
            **errors(405),
        },
    )
    def serve() -> Response[str]:
        return Response(status_code=200, content_type=media, body=_file(directory, filename),
                        headers=dict(headers))  # fmt: skip


@cache
def _file(directory: Path, filename: str) -> str:
    return (directory / filename).read_text(encoding="utf-8")


SWAGGER_UI_DIR = Path(swagger_ui.__file__).parent
for _path, (_filename, _media) in DOCS_ASSETS.items():
    _file_route(_path, SWAGGER_UI_DIR, _filename, _media, tag="docs", kind="asset",
                summary=f"The docs page's {_filename}",
                headers={"Cache-Control": "public, max-age=86400"})  # fmt: skip
DOCS_HTML = """<!DOCTYPE html>
<html lang="en">
<head>
  <meta charset="utf-8">
  <title>Timer service API</title>
  <link rel="icon" href="data:,">
  <link rel="stylesheet" href="docs/swagger-ui.css">
</head>
<body>
  <p><a href="console">Tenant console</a>: sign in with an API key to see, create and manage
     timers in the browser.</p>
  <div id="swagger-ui">Loading...</div>
  <script src="docs/swagger-ui-bundle.js"></script>
  <script>
    window.ui = SwaggerUIBundle({
      url: "openapi.json",
      dom_id: "#swagger-ui",
      deepLinking: true,
      docExpansion: "list",
      layout: "BaseLayout",
      presets: [SwaggerUIBundle.presets.apis],
      validatorUrl: null,  // no badge from validator.swagger.io: the page works offline
    });
  </script>
</body>
</html>
"""


# ---------------------------------------------------------------- the tenant console (no key)
# The page and its assets are public, like the docs page: the key is typed into the page and
# sent by its script as x-api-key. The files are the repo's own (no CDN, no build step).

CONSOLE_DIR = Path(__file__).parent / "console"
# The page runs only its own script and style and talks only to this API: an injected
# <script> or inline handler cannot run, so a key in sessionStorage is not an XSS away.
CONSOLE_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'"
)
CONSOLE_HEADERS = {
    "Content-Security-Policy": CONSOLE_CSP,
    # Revalidate every time: the files are not versioned by name, and a page of one deploy
    # with the script of another would break.
    "Cache-Control": "no-cache",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


for _path, (_filename, _media) in CONSOLE_FILES.items():
    _file_route(_path, CONSOLE_DIR, _filename, _media, tag="console", headers=CONSOLE_HEADERS,
                kind="console_file",
                summary=f"The tenant console's {_filename}" if _path != "/v1/console" else
                "The tenant console: timers, fires and failed fires in the browser")  # fmt: skip


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
    response = error_response(exc.status, exc.code, exc.message, exc.details)
    if isinstance(exc, RateLimited):
        response.headers["Retry-After"] = str(RETRY_AFTER_S)
    return response


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
    # Where it failed, not the message: a message can quote the request (a payload, a header).
    logger.error("unhandled error", extra={"error": type(exc).__name__, "trace": frames(exc)})
    return error_response(500, "internal_error", "internal error; it has been logged")


def frames(exc: BaseException) -> list[str]:
    """``file:line in function`` of each frame of ``exc`` (and the exceptions it chains), with
    no message and no local value."""
    lines: list[str] = []
    link: BaseException | None = exc
    while link is not None and len(lines) < 200:
        lines.append(type(link).__name__)
        for frame in traceback.extract_tb(link.__traceback__):
            lines.append(f"{Path(frame.filename).name}:{frame.lineno} in {frame.name}")
        link = link.__cause__ or link.__context__
    return lines


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
    return _declared_only(schema)


def _declared_only(schema: OpenAPI) -> OpenAPI:
    """What the API answers and nothing else. The framework adds a 422 to every operation
    (its validation error), which this API never sends: request_invalid answers 400. It also
    gives a response without ``content`` the return type's, which a 204 does not have."""
    data = schema.model_dump(by_alias=True, exclude_none=True)
    for item in data.get("paths", {}).values():
        for operation in item.values():
            responses = operation["responses"]
            responses.pop("422", None)
            responses.pop(422, None)
            for status, response in responses.items():
                if int(status) == 204:
                    response.pop("content", None)
    schemas = data.get("components", {}).get("schemas", {})
    for unused in ("HTTPValidationError", "ValidationError", "ResponseValidationError"):
        schemas.pop(unused, None)
    return OpenAPI.model_validate(data)


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
    """Checks that come before the handler and body validation: route and method, key, rate,
    then - on the routes that take a body - size, encoding and content type. A rejection, or
    the event to resolve. Routes without a body ignore one, whatever it is."""
    request = APIGatewayProxyEventV2(event)
    method, path = request.http_method.upper(), request.path
    methods = route_methods(path)
    if method not in methods:  # like the gateway before it: no key needed to learn this
        return route_error(method, path)
    if path not in PUBLIC_PATHS:
        try:
            caller = runtime().authenticate(
                request.headers.get("x-api-key"),
                lambda: runtime().rate_limiter.allow(
                    f"ip:{request.request_context.http.source_ip}", KEY_LOOKUPS_PER_S
                ),
            )
        except RateLimited as exc:
            return domain_error(exc)
        if caller is None:
            return domain_error(Unauthorized("missing or unknown x-api-key"))
        if not runtime().rate_limiter.allow(caller.name, caller.rate_limit_per_s):
            return domain_error(RateLimited("tenant request rate exceeded; retry shortly"))
        app.append_context(tenant=caller)
        logger.append_keys(tenant=caller.name)
    if not methods[method].dependant.body_params:
        return event
    raw = _raw_body(event)
    if len(raw) > BODY_LIMIT_BYTES:
        return domain_error(PayloadTooLarge(f"request body is over {BODY_LIMIT_BYTES} bytes"))
    try:
        raw.decode()
    except UnicodeDecodeError:  # JSON is UTF-8; anything else is malformed, not a crash
        return domain_error(m.InvalidInput("malformed JSON", [FieldError("body", "not UTF-8")]))
    content_type = request.headers.get("content-type")
    if content_type:
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
# Traces keep no bodies: responses carry webhook secrets, target headers and payloads, and an
# error's message can quote the request.
@tracer.capture_lambda_handler(capture_response=False, capture_error=False)
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    app.context.clear()
    checked = _preflight(event)
    if isinstance(checked, Response):
        return _proxy(checked)
    return app.resolve(checked, context)

"""HTTP API (API Gateway REST proxy -> Lambda). Thin: parse, call the service, map errors.

Every failure leaves as the contract's error body: ``{"error": {"code", "message", "details"}}``.
"""

from __future__ import annotations

import base64
import json
from functools import cache
from http import HTTPStatus
from typing import Annotated, Any

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.event_handler import APIGatewayRestResolver, Response, content_types
from aws_lambda_powertools.event_handler.exceptions import NotFoundError
from aws_lambda_powertools.event_handler.openapi.exceptions import RequestValidationError
from aws_lambda_powertools.event_handler.openapi.models import APIKey
from aws_lambda_powertools.event_handler.openapi.params import Query
from aws_lambda_powertools.logging import correlation_paths
from aws_lambda_powertools.utilities.typing import LambdaContext

from timers import http_models as m
from timers.core.errors import DomainError, FieldError, PayloadTooLarge, RateLimited, Unauthorized
from timers.core.timer import STATUSES, serialize_payload
from timers.runtime import Runtime, build_runtime
from timers.tenants import Tenant, summary

logger = Logger()
tracer = Tracer()
metrics = Metrics()
app = APIGatewayRestResolver(enable_validation=True)

BODY_LIMIT_BYTES = 256 * 1024
PUBLIC_RESOURCES = frozenset({"/v1/health", "/v1/openapi.json"})
StatusFilter = Annotated[str | None, Query(description="active | paused | completed")]
Limit = Annotated[int, Query(ge=1, le=100)]
_ERROR = {
    "description": "The contract's error body",
    "content": {"application/json": {"model": m.ErrorOut}},
}
ERRORS: dict[int, Any] = {status: _ERROR for status in (400, 401, 404, 409, 413, 429)}


@cache
def runtime() -> Runtime:
    """Clients and settings, built once per cold start (not at import)."""
    return build_runtime()


def tenant() -> Tenant:
    current: Tenant = app.context["tenant"]
    return current


# ---------------------------------------------------------------- routes


@app.get("/v1/health", summary="Liveness", security=[])
def health() -> dict[str, str]:
    return {"status": "ok"}


@app.get("/v1/openapi.json", include_in_schema=False)
def openapi() -> Response[str]:
    return Response(
        status_code=200,
        content_type=content_types.APPLICATION_JSON,
        body=openapi_document(),
    )


@app.get("/v1/tenant", responses=ERRORS, summary="Who am I")
def who_am_i() -> m.TenantOut:
    return m.TenantOut(**summary(tenant()))


@app.post("/v1/timers", responses=ERRORS, summary="Create a timer")
def create_timer(body: m.TimerCreate) -> Response[m.TimerOut]:
    key = app.current_event.headers.get("Idempotency-Key")
    spec = m.to_spec(body, serialize_payload(body.payload))
    view = runtime().service.create(tenant(), spec, key or None)
    return _json(HTTPStatus.CREATED, view)


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
    "/v1/timers/<timer_id>", responses=ERRORS, summary="Update a timer; its next fire is recomputed"
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
    responses=ERRORS,
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


@app.not_found
def route_not_found(exc: NotFoundError) -> Response[Any]:
    return error_response(404, "not_found", "no such route")


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
    if len(loc) >= 2 and loc[0] == "schedule" and loc[1] in _UNION_TAGS:
        loc = [loc[0], *loc[2:]]  # drop the discriminated union's tag
    loc = [p for p in loc if not p.isdigit() or loc[0] != "body"]
    if error.get("type") == "json_invalid":
        return FieldError("body", "malformed JSON")
    message = str(error.get("msg") or error.get("type", "invalid value"))
    if error.get("type") == "extra_forbidden":
        message = "unknown field"
    return FieldError(".".join(loc) or "body", message)


@cache
def openapi_document() -> str:
    return app.get_openapi_json_schema(
        title="Timer service",
        version="1.0.0",
        description="Second-precision timers that call back to SQS. See README.md.",
        security_schemes={"apiKey": APIKey.model_validate({"in": "header", "name": "x-api-key"})},
        security=[{"apiKey": []}],
    )


# ---------------------------------------------------------------- entry point


def _raw_body(event: dict[str, Any]) -> bytes:
    body = event.get("body") or ""
    return base64.b64decode(body) if event.get("isBase64Encoded") else body.encode()


def _preflight(event: dict[str, Any]) -> Response[Any] | None:
    """Checks that come before routing and body validation: size, encoding, key, rate."""
    raw = _raw_body(event)
    if len(raw) > BODY_LIMIT_BYTES:
        return domain_error(PayloadTooLarge(f"request body is over {BODY_LIMIT_BYTES} bytes"))
    try:
        raw.decode()
    except UnicodeDecodeError:  # JSON is UTF-8; anything else is malformed, not a crash
        return domain_error(m.InvalidInput("malformed JSON", [FieldError("body", "not UTF-8")]))
    if event.get("resource") in PUBLIC_RESOURCES or event.get("path") in PUBLIC_RESOURCES:
        return None
    headers = {k.lower(): v for k, v in (event.get("headers") or {}).items()}
    caller = runtime().authenticate(headers.get("x-api-key"))
    if caller is None:
        return domain_error(Unauthorized("missing or unknown x-api-key"))
    if not runtime().rate_limiter.allow(caller.name, caller.rate_limit_per_s):
        return domain_error(RateLimited("tenant request rate exceeded; retry shortly"))
    app.append_context(tenant=caller)
    logger.append_keys(tenant=caller.name)
    return None


def _proxy(response: Response[Any]) -> dict[str, Any]:
    body = response.body if isinstance(response.body, str) else json.dumps(response.body)
    return {
        "statusCode": response.status_code,
        "headers": {"Content-Type": content_types.APPLICATION_JSON},
        "body": body,
        "isBase64Encoded": False,
    }


@logger.inject_lambda_context(correlation_id_path=correlation_paths.API_GATEWAY_REST)
@tracer.capture_lambda_handler
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    app.context.clear()
    rejected = _preflight(event)
    if rejected is not None:
        return _proxy(rejected)
    return app.resolve(event, context)

"""Errors, in one place: every failure leaves as the contract's body ``{"error": {"code",
"message", "details"}}``."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.openapi.exceptions import (
    RequestUnsupportedContentType,
    RequestValidationError,
)

from timers.core.errors import DomainError, FieldError, RateLimited, Unavailable, trace_frames

from .resolver import app, json_response, logger

RETRY_AFTER_S = 1
"""Retry-After of a 429 (the rate limiter's window is one second: timers.tenancy.ratelimit)
and of a 503 (run now's reference clock: Redis is back within seconds of a failover)."""


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
    return json_response(status, body)


@app.exception_handler(DomainError)
def domain_error(exc: DomainError) -> Response[Any]:
    message = invalid_message(exc.details, exc.message) if exc.status == 400 else exc.message
    response = error_response(exc.status, exc.code, message, exc.details)
    if isinstance(exc, RateLimited | Unavailable):
        response.headers["Retry-After"] = str(RETRY_AFTER_S)
    return response


@app.exception_handler(RequestValidationError)
def request_invalid(exc: RequestValidationError) -> Response[Any]:
    details = [_field_error(e) for e in exc.errors()]
    message = invalid_message(details, "the request is invalid")
    return error_response(400, "validation_error", message, details)


@app.exception_handler(RequestUnsupportedContentType)
def unsupported_content_type(exc: RequestUnsupportedContentType) -> Response[Any]:
    # The preflight answers a body that is not JSON first; this is the framework's own check.
    return unsupported_media_type(app.current_event.headers.get("content-type", ""))


def unsupported_media_type(content_type: str) -> Response[Any]:
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
    logger.error("unhandled error", extra={"error": type(exc).__name__, "trace": trace_frames(exc)})
    return error_response(500, "internal_error", "internal error; it has been logged")


_UNION_TAGS = ("at", "after", "cron", "every")
_SHOWN_IN_MESSAGE = 3  # details a 400's message names; the rest are counted


def invalid_message(details: list[FieldError], fallback: str) -> str:
    """A 400's message: the offending fields in the contract's names, each with why."""
    if not details:
        return fallback
    shown = "; ".join(f"{d.field}: {d.message}" for d in details[:_SHOWN_IN_MESSAGE])
    more = len(details) - _SHOWN_IN_MESSAGE
    return shown + (f"; and {more} more" if more > 0 else "")


def _field_error(error: dict[str, Any]) -> FieldError:
    """Pydantic's error -> the contract's dotted field name (``schedule.expression``) and a
    plain sentence of what it must be."""
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
    kind = str(error.get("type", ""))
    if kind == "json_invalid":
        return FieldError("body", "is not valid JSON")
    if kind.startswith("union_tag_"):  # the schedule's type is missing or unknown
        parts.append("type")
    return FieldError(".".join(parts) or "body", _sentence(kind, error))


def _sentence(kind: str, error: dict[str, Any]) -> str:
    ctx = error.get("ctx") or {}
    if kind in ("too_short", "string_too_short") and ctx.get("min_length") == 1:
        return "must not be empty"
    if kind in _SENTENCES:
        return _SENTENCES[kind].format(**{k: _shown(v) for k, v in ctx.items()})
    message = str(error.get("msg") or "is invalid")
    return message.removeprefix("Value error, ")  # our own validators' words (times)


def _shown(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


_SCHEDULE_TYPES = "'at', 'after', 'cron' or 'every'"
_SENTENCES = {  # pydantic's error types, in plain words (its own messages name Python types)
    "missing": "is required",
    "extra_forbidden": "is not a field of this request",
    "model_type": "must be a JSON object",
    "model_attributes_type": "must be a JSON object",
    "dict_type": "must be a JSON object",
    "list_type": "must be a JSON array",
    "string_type": "must be a string",
    "int_type": "must be a whole number",
    "int_parsing": "must be a whole number",
    "int_from_float": "must be a whole number",
    "float_type": "must be a number",
    "float_parsing": "must be a number",
    "finite_number": "must be a finite number",
    "bool_type": "must be true or false",
    "bool_parsing": "must be true or false",
    "greater_than_equal": "must be at least {ge}",
    "greater_than": "must be more than {gt}",
    "less_than_equal": "must be at most {le}",
    "less_than": "must be less than {lt}",
    "string_too_long": "must be at most {max_length} characters",
    "string_too_short": "must be at least {min_length} characters",
    "too_long": "must hold at most {max_length} items",
    "too_short": "must hold at least {min_length} items",
    "literal_error": "must be {expected}",
    "union_tag_invalid": f"must be {_SCHEDULE_TYPES}, not '{{tag}}'",
    "union_tag_not_found": f"is required: {_SCHEDULE_TYPES}",
}

"""Errors, in one place: every failure leaves as the contract's body ``{"error": {"code",
"message", "details"}}``."""

from __future__ import annotations

import traceback
from pathlib import Path
from typing import Any

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.openapi.exceptions import (
    RequestUnsupportedContentType,
    RequestValidationError,
)

from timers.core.errors import DomainError, FieldError, RateLimited

from .resolver import app, json_response, logger

RETRY_AFTER_S = 1  # the rate limiter's window is one second (timers.adapters.ratelimit)


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

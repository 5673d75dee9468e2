"""Domain errors. The api maps each to the contract's error body in one place."""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class FieldError:
    """One offending input: ``field`` is a dotted path such as ``schedule.expression``."""

    field: str
    message: str


class DomainError(Exception):
    status = 500
    code = "internal_error"

    def __init__(self, message: str, details: list[FieldError] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = details or []


class InvalidInput(DomainError):
    status, code = 400, "validation_error"


class Unauthorized(DomainError):
    status, code = 401, "unauthorized"


class NotFound(DomainError):
    status, code = 404, "not_found"


class InvalidState(DomainError):
    """Well-formed, but the timer's state forbids it (e.g. resuming a completed timer)."""

    status, code = 409, "invalid_state"


class IdempotencyConflict(DomainError):
    status, code = 409, "idempotency_conflict"


class PayloadTooLarge(DomainError):
    status, code = 413, "payload_too_large"


class RateLimited(DomainError):
    status, code = 429, "rate_limited"


class Unavailable(DomainError):
    """A part the request cannot do without does not answer now (nothing was done): run now's
    reference clock. Where Redis is only an index or a limiter the api goes on without it."""

    status, code = 503, "unavailable"


class ConcurrentUpdate(DomainError):
    """Another writer changed the item between our read and our conditional write."""

    status, code = 409, "concurrent_update"


def trace_frames(exc: BaseException) -> list[str]:
    """``file:line in function`` of each frame of ``exc`` (and the exceptions it chains), with
    no message and no local value: what a log line may say of an error, as a message can quote
    the request (a payload, a webhook's header value)."""
    lines: list[str] = []
    link: BaseException | None = exc
    while link is not None and len(lines) < 200:
        lines.append(type(link).__name__)
        for frame in traceback.extract_tb(link.__traceback__):
            lines.append(f"{Path(frame.filename).name}:{frame.lineno} in {frame.name}")
        link = link.__cause__ or link.__context__
    return lines

"""Every non-2xx answer as an exception carrying the contract's error body."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ErrorDetail:
    field: str
    message: str


@dataclass
class ApiError(Exception):
    """``{"error": {"code", "message", "details"}}`` of a non-2xx answer, with its status."""

    status: int
    code: str
    message: str
    details: list[ErrorDetail] = field(default_factory=list)
    retry_after_s: float | None = None

    def __str__(self) -> str:
        # A 400's message already names its fields; what it leaves out is added.
        more = [f"{d.field}: {d.message}" for d in self.details]
        fields = "; ".join(text for text in more if text not in self.message)
        return f"{self.status} {self.code}: {self.message}" + (f" ({fields})" if fields else "")

    @property
    def fields(self) -> set[str]:
        return {d.field for d in self.details}


class ValidationError(ApiError):
    """400 validation_error: ``details`` names each offending field."""


class Unauthorized(ApiError):
    """401: missing or unknown API key."""


class NotFound(ApiError):
    """404: no such timer for this tenant (or no such route)."""


class MethodNotAllowed(ApiError):
    """405."""


class Conflict(ApiError):
    """409: idempotency_conflict, concurrent_update."""


class InvalidState(Conflict):
    """409 invalid_state: pause/resume of a completed timer."""


class PayloadTooLarge(ApiError):
    """413."""


class UnsupportedMediaType(ApiError):
    """415."""


class RateLimited(ApiError):
    """429, after the client's own retries ran out; ``retry_after_s`` says when to come back."""


_BY_STATUS: dict[int, type[ApiError]] = {
    400: ValidationError,
    401: Unauthorized,
    404: NotFound,
    405: MethodNotAllowed,
    409: Conflict,
    413: PayloadTooLarge,
    415: UnsupportedMediaType,
    429: RateLimited,
}


def error_from(status: int, body: Any, retry_after_s: float | None = None) -> ApiError:
    """The exception for an answer; a body that is not the contract's (a gateway's own 429
    ``{"message": ...}``, an HTML page) keeps its text as the message."""
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        code = str(error.get("code", "unknown"))
        message = str(error.get("message", ""))
        details = [
            ErrorDetail(str(d.get("field", "")), str(d.get("message", "")))
            for d in error.get("details") or []
            if isinstance(d, dict)
        ]
    else:
        code = f"http_{status}"
        message = str(body.get("message") if isinstance(body, dict) else body)[:500]
        details = []
    cls = InvalidState if code == "invalid_state" else _BY_STATUS.get(status, ApiError)
    return cls(status, code, message, details, retry_after_s)

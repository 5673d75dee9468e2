"""Domain errors. The api maps each to the contract's error body in one place."""

from __future__ import annotations

from dataclasses import dataclass


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


class ConcurrentUpdate(DomainError):
    """Another writer changed the item between our read and our conditional write."""

    status, code = 409, "concurrent_update"

"""One POST of a webhook: how it is signed, what its answer means, when it is tried again,
and the fire's delivery record. Pure rules, no I/O (timers.delivery.http_target makes the POST,
timers.delivery the delivery function; what a target may be is timers.core.webhooks).

Signatures follow the Standard Webhooks specification (https://www.standardwebhooks.com):
``webhook-id`` is the fire id, ``webhook-timestamp`` the attempt's Unix seconds, and
``webhook-signature`` one ``v1,<base64 HMAC-SHA256 of "id.timestamp.body">`` per valid secret,
space-separated, so a consumer verifies with the ``standardwebhooks`` package.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from timers.core.numbers import ascii_int

SECRET_PREFIX = "whsec_"
SECRET_BYTES = 24

ATTEMPT_TIMEOUT_S = 10.0
"""One POST (connect, send, answer) ends within this; longer is a timeout, retried."""

BACKOFF_FIRST_S = 5.0
BACKOFF_MAX_S = 3_600.0
"""Retry n waits about BACKOFF_FIRST_S * 2^(n-1), at most BACKOFF_MAX_S (an hour), jittered."""

RESPONSE_BODY_MAX = 4_096
"""Bytes of an answer's body read; never logged."""
ANSWER_KEPT_BYTES = 512
"""The start of an answer's body kept, as text, in the fire's delivery record (``last_error``):
enough for an endpoint's error message, bounded so a record stays ~1 WRU."""


# ---------------------------------------------------------------- signatures


def new_secret() -> str:
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode()


def _key(secret: str) -> bytes:
    raw = secret.removeprefix(SECRET_PREFIX)
    return base64.b64decode(raw)


def signature(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """One ``v1,<base64>`` entry: HMAC-SHA256 of ``id.timestamp.body`` under ``secret``."""
    signed = f"{msg_id}.{timestamp}.".encode() + body
    digest = hmac.new(_key(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def signed_headers(
    secrets_: Sequence[str], msg_id: str, timestamp: int, body: bytes
) -> dict[str, str]:
    """The three Standard Webhooks headers; one signature per valid secret (a rotation)."""
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": " ".join(signature(s, msg_id, timestamp, body) for s in secrets_),
    }


# ---------------------------------------------------------------- outcomes and retries

Verdict = Literal["delivered", "retry", "failed"]


@dataclass(frozen=True)
class Attempt:
    """How one POST went: the HTTP status, or the error that stood in for one."""

    status: int | None = None  # the answer's status; None: no answer
    error: str | None = None  # timeout | connection_error | blocked_address | invalid_target
    retry_after_s: int | None = None  # the answer's Retry-After (seconds), if it gave one
    body: str = ""  # the answer's first ANSWER_KEPT_BYTES, as text (never the request's)
    latency_ms: int = 0  # from the start of the attempt to its answer or error

    @property
    def label(self) -> str:
        return f"http {self.status}" if self.status is not None else str(self.error)


@dataclass(frozen=True)
class DeliveryState:
    """An HTTP fire's delivery record (beside its claim entry): what the history shows."""

    attempts: int = 0
    first_ms: int | None = None  # the first attempt (the retry budget counts from it)
    last_ms: int | None = None
    last_status: int | None = None  # the last answer's HTTP status; None: no answer
    last_error: str | None = None  # timeout | connection_error | blocked_address | ...
    last_body: str | None = None  # the last answer's first ANSWER_KEPT_BYTES, as text
    last_latency_ms: int | None = None
    delivered_ms: int | None = None
    failed: str | None = None  # why delivery ended without success
    failed_ms: int | None = None  # when (it names the fire's record in the failed-fires table)
    base_attempts: int | None = None  # attempts before its redelivery (outside its budget)

    @property
    def budget_attempts(self) -> int:
        """Attempts of the current budget (since the redelivery, if any)."""
        return self.attempts - (self.base_attempts or 0)

    @property
    def settled(self) -> bool:
        return self.delivered_ms is not None or self.failed is not None

    def reopened(self, at_ms: int) -> DeliveryState:
        """This failed record made pending again by a redelivery at ``at_ms``: the attempts
        and the last answer are kept (the history still shows them), the retry budget starts
        over from ``at_ms``."""
        return DeliveryState(
            attempts=self.attempts,
            first_ms=at_ms,
            last_ms=self.last_ms,
            last_status=self.last_status,
            last_error=self.last_error,
            last_body=self.last_body,
            last_latency_ms=self.last_latency_ms,
            base_attempts=self.attempts,
        )

    def redelivered_since(self, redelivered_ms: int | None) -> bool:
        """Whether a redelivery at ``redelivered_ms`` reopens this record: it failed before
        then (a failure after it is the redelivery's own, and stands)."""
        return (
            redelivered_ms is not None
            and self.failed is not None
            and (self.failed_ms or 0) < redelivered_ms
        )

    def after(self, attempt: Attempt, now_ms: int) -> DeliveryState:
        """This record with one more attempt counted."""
        return DeliveryState(
            attempts=self.attempts + 1,
            first_ms=self.first_ms if self.first_ms is not None else now_ms,
            last_ms=now_ms,
            last_status=attempt.status,
            last_error=attempt.error,
            last_body=attempt.body or None,  # nothing stored for an empty answer
            last_latency_ms=attempt.latency_ms,
            base_attempts=self.base_attempts,
        )

    def last_attempt(self) -> dict[str, object] | None:
        """``last_error`` of the fire's view: how the last POST went (None before one)."""
        if self.attempts == 0:
            return None
        return {
            "status": self.last_status,
            "error": self.last_error,
            "body": self.last_body or "",
            "latency_ms": self.last_latency_ms or 0,
        }


def verdict(attempt: Attempt) -> Verdict:
    """2xx delivers; 408, 429, 5xx, timeouts and connection errors are retried; other answers
    (3xx: redirects are not followed; 4xx), refused addresses and targets that cannot be sent
    (``invalid_target``) fail at once."""
    if attempt.status is not None:
        if 200 <= attempt.status < 300:
            return "delivered"
        if attempt.status in (408, 429) or attempt.status >= 500:
            return "retry"
        return "failed"
    return "retry" if attempt.error in ("timeout", "connection_error") else "failed"


def backoff_s(retry: int, jitter: float) -> float:
    """Wait before retry number ``retry`` (1-based): exponential, capped, with "equal jitter"
    (``jitter`` in [0, 1) picks a point in the upper half), so retries of many fires that
    failed together spread out instead of arriving together again."""
    ceiling = min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2 ** min(max(retry - 1, 0), 30))
    return ceiling / 2 + ceiling / 2 * jitter


def retry_wait_s(retry: int, jitter: float, retry_after_s: int | None) -> float:
    """The backoff, or longer when the endpoint asked for it (Retry-After on a 429 or 503),
    never past BACKOFF_MAX_S."""
    return min(BACKOFF_MAX_S, max(backoff_s(retry, jitter), float(retry_after_s or 0)))


def parse_retry_after(value: str | None) -> int | None:
    """Retry-After in delay-seconds form, ASCII digits (an HTTP date, or anything else, is
    ignored: the backoff applies)."""
    return None if value is None else ascii_int(value.strip())

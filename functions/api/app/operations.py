"""What the OpenAPI document says of each operation beyond its models: the success and error
responses it can give, and the query and header parameters routes share."""

from __future__ import annotations

from typing import Annotated, Any

from aws_lambda_powertools.event_handler.openapi.params import Header, Query

from timers.api import response_models as m

Limit = Annotated[int, Query(ge=1, le=100, description="Page size")]
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
    404: "not_found: no such timer (or key, or group) for this tenant",
    405: "method_not_allowed: the path does not serve this method; `Allow` lists those it does",
    409: "invalid_state (pause/resume of a completed timer; redelivery of a fire that is not "
    "failed; a reset meeting a fire claimed by a run that died; an 11th API key; revoking the "
    "last one), concurrent_update (the timer kept changing under the request: retry)",
    413: "payload_too_large: payload over 64 KiB or request body over 256 KiB",
    415: "unsupported_media_type: the body is not sent as JSON (Content-Type: application/json)",
    429: "rate_limited: the tenant is over its request rate; retry after `Retry-After` seconds. "
    "(Over the stage-wide safety throttle, API Gateway itself answers 429 "
    '`{"message":"Too Many Requests"}`.)',
    503: "unavailable: the service could not answer in time (busy, or starting up), or - for run "
    "now - its reference clock (Redis TIME, what fires are timed by) cannot be read or trusted "
    "now (then nothing was done: no fire claimed or sent); retry after `Retry-After` seconds. A "
    "request cut off by the time limit may have taken effect: retry a create with the same "
    "`Idempotency-Key`",
}
SLOW = 503
"""Every operation can answer it (functions/api/app/deadline.py); openapi.py declares it on
each, so the routes do not list it."""
_HEADERS: dict[int, dict[str, Any]] = {
    405: {"Allow": {"description": "The methods this path serves", "schema": {"type": "string"}}},
    429: {
        "Retry-After": {
            "description": "Seconds until the tenant's rate window reopens",
            "schema": {"type": "integer", "minimum": 1},
        }
    },
    503: {
        "Retry-After": {
            "description": "Seconds after which to ask again",
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

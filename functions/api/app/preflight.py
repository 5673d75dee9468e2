"""Checks that come before routing and body validation, in the order a gateway would make them:
route and method, key, rate, then - on the routes that take a body - size, encoding and content
type. (Not CORS: the console is served from the API's own origin, so the API sends no CORS
headers and an ``OPTIONS`` request is a 405 like any method a path does not serve.)"""

from __future__ import annotations

import base64
import json
from typing import Any

from aws_lambda_powertools.event_handler import Response, content_types
from aws_lambda_powertools.utilities.data_classes import APIGatewayProxyEventV2

from timers.core.errors import FieldError, InvalidInput, PayloadTooLarge, RateLimited, Unauthorized

from .errors import domain_error, unsupported_media_type
from .resolver import app, logger, runtime
from .routing import route_error, route_methods

BODY_LIMIT_BYTES = 256 * 1024
KEY_LOOKUPS_PER_S = 10
"""Keys no api sandbox remembers, looked up per second and source address: each costs a read of
the tenants table, so made-up keys are refused before they reach it."""


def check(event: dict[str, Any]) -> Response[Any] | dict[str, Any]:
    """A rejection, or the event to resolve. Routes without a body ignore one, whatever it is."""
    request = APIGatewayProxyEventV2(event)
    method, path = request.http_method.upper(), request.path
    methods = route_methods(path)
    if method not in methods:  # like the gateway before it: no key needed to learn this
        return route_error(method, path)
    operation = methods[method]
    if not operation.public:
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
    if not operation.takes_body:
        return event
    raw = _raw_body(event)
    if len(raw) > BODY_LIMIT_BYTES:
        return domain_error(PayloadTooLarge(f"request body is over {BODY_LIMIT_BYTES} bytes"))
    try:
        raw.decode()
    except UnicodeDecodeError:  # JSON is UTF-8; anything else is malformed, not a crash
        not_utf8 = FieldError("body", "is not UTF-8 text")
        return domain_error(InvalidInput("malformed JSON", [not_utf8]))
    content_type = request.headers.get("content-type")
    if content_type:
        if not is_json(content_type):
            return unsupported_media_type(content_type)
        # Accepted as JSON; the framework parses only a literal application/json as JSON.
        headers = {k: v for k, v in event["headers"].items() if k.lower() != "content-type"}
        event = {**event, "headers": {**headers, "content-type": "application/json"}}
    return event


def is_json(content_type: str) -> bool:
    """application/json or any */*+json type; parameters (charset=...) do not matter."""
    media = content_type.split(";", 1)[0].strip().lower()
    main, _, sub = media.partition("/")
    return media == "application/json" or (bool(main) and sub.endswith("+json"))


def _raw_body(event: dict[str, Any]) -> bytes:
    body = event.get("body") or ""
    return base64.b64decode(body) if event.get("isBase64Encoded") else body.encode()


def as_proxy_result(response: Response[Any]) -> dict[str, Any]:
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

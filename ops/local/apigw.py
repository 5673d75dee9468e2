"""API Gateway HTTP API, Lambda proxy integration with payload format 2.0: HTTP request ->
event, Lambda result -> HTTP response, and the answers an HTTP API gives itself.

Pure functions, shared by the local stack's HTTP server and the tests' in-process API.
"""

from __future__ import annotations

import base64
import binascii
import json
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl

from ops.local.spec import ACCOUNT, DEFAULT_STAGE

API_ID = "local"
# Bodies an HTTP API hands over as text; every other body (no Content-Type at all, form data,
# octet-stream, ...) arrives base64-encoded with isBase64Encoded. AWS does not list these; this
# is the split observed on real HTTP APIs.
_TEXT_TYPES = ("application/json", "application/xml", "application/javascript")
# What an HTTP API answers by itself (no route, failed function, unusable result, integration
# timeout).
_GATEWAY_MESSAGES = {
    404: "Not Found",
    413: "Request Entity Too Large",
    429: "Too Many Requests",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


@dataclass(frozen=True)
class HttpResponse:
    status: int
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""


def request_id() -> str:
    """An id shaped like an HTTP API's (``JKJaXmPLvHcESHA=``)."""
    return base64.b64encode(secrets.token_bytes(11)).decode()


def is_text(content_type: str | None) -> bool:
    """Whether an HTTP API passes a body of this Content-Type as text rather than base64."""
    media = (content_type or "").split(";", 1)[0].strip().lower()
    return media.startswith("text/") or media in _TEXT_TYPES


def proxy_event(
    method: str,
    path: str,
    *,
    route_key: str,
    path_params: dict[str, str] | None = None,
    stage: str = DEFAULT_STAGE,
    headers: Sequence[tuple[str, str]] = (),
    query: str = "",
    body: bytes | None = None,
    source_ip: str = "127.0.0.1",
    now: float | None = None,
) -> dict[str, Any]:
    """The event an HTTP API's Lambda proxy integration (payload format 2.0) gives the function.

    ``query`` is the raw query string. Header names are lower-cased and a repeated header's
    values joined with commas, as are a repeated query parameter's; ``Cookie`` headers become
    the ``cookies`` list. The body is text when its Content-Type is a text type and it is
    UTF-8, else base64 with ``isBase64Encoded``. A stage other than ``$default`` prefixes the
    raw path, as it does in the stage's URL. Empty parts are left out, as API Gateway does.
    """
    joined: dict[str, str] = {}
    cookies: list[str] = []
    for name, value in headers:
        key = name.lower()
        if key == "cookie":
            cookies += [c.strip() for c in value.split(";") if c.strip()]
        else:
            joined[key] = f"{joined[key]},{value}" if key in joined else value
    params: dict[str, str] = {}
    for name, value in parse_qsl(query, keep_blank_values=True):
        params[name] = f"{params[name]},{value}" if name in params else value
    now = time.time() if now is None else now
    raw_path = path if stage == DEFAULT_STAGE else f"/{stage}{path}"
    event: dict[str, Any] = {
        "version": "2.0",
        "routeKey": route_key,
        "rawPath": raw_path,
        "rawQueryString": query,
    }
    if cookies:
        event["cookies"] = cookies
    event["headers"] = joined
    if params:
        event["queryStringParameters"] = params
    event["requestContext"] = {
        "accountId": ACCOUNT,
        "apiId": API_ID,
        "domainName": joined.get("host", "localhost"),
        "domainPrefix": joined.get("host", "localhost").split(".", 1)[0],
        "http": {
            "method": method,
            "path": raw_path,
            "protocol": "HTTP/1.1",
            "sourceIp": source_ip,
            "userAgent": joined.get("user-agent", ""),
        },
        "requestId": request_id(),
        "routeKey": route_key,
        "stage": stage,
        "time": time.strftime("%d/%b/%Y:%H:%M:%S +0000", time.gmtime(now)),
        "timeEpoch": int(now * 1000),
    }
    if path_params:
        event["pathParameters"] = dict(path_params)
    encoded = False
    if body:
        text = None
        if is_text(joined.get("content-type")):
            try:
                text = body.decode()
            except UnicodeDecodeError:
                text = None
        if text is None:
            text, encoded = base64.b64encode(body).decode(), True
        event["body"] = text
    event["isBase64Encoded"] = encoded
    return event


def from_proxy_result(payload: bytes) -> HttpResponse | None:
    """The HTTP response a function's result describes under payload format 2.0; None when
    API Gateway could not use it (it answers 500 then).

    A JSON result without ``statusCode`` is itself the body of a 200 ``application/json``
    response. Otherwise ``headers`` (one value each), ``cookies`` (one ``Set-Cookie`` each),
    ``body`` and ``isBase64Encoded`` make the response; ``multiValueHeaders`` is a 1.0 field
    and ignored.
    """
    try:
        result = json.loads(payload)
    except ValueError:
        return None
    if not isinstance(result, dict) or "statusCode" not in result:
        return HttpResponse(200, [("Content-Type", "application/json")], payload)
    try:
        status = result["statusCode"]
        if isinstance(status, bool) or not isinstance(status, int) or not 100 <= status <= 599:
            return None
        headers = [(str(k), _header_value(v)) for k, v in (result.get("headers") or {}).items()]
        headers += [("Set-Cookie", str(c)) for c in result.get("cookies") or []]
        body = result.get("body") or ""
        if not isinstance(body, str):
            return None
        data = base64.b64decode(body, validate=True) if result.get("isBase64Encoded") else None
    except (TypeError, AttributeError, binascii.Error):
        return None
    return HttpResponse(status, headers, body.encode() if data is None else data)


def _header_value(value: Any) -> str:
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value)


def gateway_response(status: int, request: str | None = None) -> HttpResponse:
    """An answer the HTTP API gives itself: ``{"message": ...}``, its own body, since HTTP
    APIs have no gateway responses to reshape it (404 no route, 500 failed function, 503 no
    answer within the integration timeout)."""
    body = json.dumps({"message": _GATEWAY_MESSAGES[status]}).encode()
    return HttpResponse(
        status,
        [("Content-Type", "application/json"), ("apigw-requestid", request or request_id())],
        body,
    )

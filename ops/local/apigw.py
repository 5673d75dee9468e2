"""API Gateway REST (v1) proxy integration: HTTP request -> event, Lambda result -> response.

Pure functions, shared by the local stack's HTTP server and the tests' in-process API.
"""

from __future__ import annotations

import base64
import contextlib
import json
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ops.local.spec import ACCOUNT

# API Gateway's own answers, used when the template's GatewayResponses do not override them.
_DEFAULT_RESPONSES = {
    "MISSING_AUTHENTICATION_TOKEN": (403, "Missing Authentication Token"),
    "BAD_RESPONSE": (502, "Internal server error"),  # the Lambda result is not a proxy result
    "INTEGRATION_FAILURE": (502, "Internal server error"),  # the function failed
}


@dataclass(frozen=True)
class HttpResponse:
    status: int
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""


def proxy_event(
    method: str,
    path: str,
    *,
    resource: str,
    path_params: dict[str, str],
    stage: str,
    headers: Sequence[tuple[str, str]] = (),
    query: Sequence[tuple[str, str]] = (),
    body: bytes | None = None,
    binary: bool = False,
    source_ip: str = "127.0.0.1",
) -> dict[str, Any]:
    """The event API Gateway's proxy integration gives the function.

    Single-value maps keep the last value of a repeated header or parameter, as API Gateway
    does. The body is text when it is UTF-8, else (or when ``binary``: its content type is one
    of the API's binary media types) base64 with ``isBase64Encoded``.
    """
    single_headers = dict(headers)
    multi_headers: dict[str, list[str]] = {}
    for name, value in headers:
        multi_headers.setdefault(name, []).append(value)
    multi_query: dict[str, list[str]] = {}
    for name, value in query:
        multi_query.setdefault(name, []).append(value)
    text: str | None = None
    encoded = False
    if body:
        with contextlib.suppress(UnicodeDecodeError):
            text = None if binary else body.decode()
        if text is None:
            text, encoded = base64.b64encode(body).decode(), True
    now = time.time()
    request_id = str(uuid.uuid4())
    user_agent = next((v for k, v in headers if k.lower() == "user-agent"), None)
    return {
        "resource": resource,
        "path": path,
        "httpMethod": method,
        "headers": single_headers or None,
        "multiValueHeaders": multi_headers or None,
        "queryStringParameters": dict(query) or None,
        "multiValueQueryStringParameters": multi_query or None,
        "pathParameters": path_params or None,
        "stageVariables": None,
        "requestContext": {
            "resourceId": "local",
            "resourcePath": resource,
            "httpMethod": method,
            "extendedRequestId": request_id,
            "requestTime": time.strftime("%d/%b/%Y:%H:%M:%S +0000", time.gmtime(now)),
            "path": f"/{stage}{path}",
            "accountId": ACCOUNT,
            "protocol": "HTTP/1.1",
            "stage": stage,
            "domainPrefix": "localhost",
            "requestTimeEpoch": int(now * 1000),
            "requestId": request_id,
            "identity": {"sourceIp": source_ip, "userAgent": user_agent},
            "domainName": "localhost",
            "apiId": "local",
        },
        "body": text,
        "isBase64Encoded": encoded,
    }


def from_proxy_result(payload: bytes) -> HttpResponse | None:
    """The HTTP response a proxy result describes; None if it is not a valid proxy result."""
    try:
        result = json.loads(payload)
        status = int(result.get("statusCode", 200))
        headers = [(k, str(v)) for k, v in (result.get("headers") or {}).items()]
        multi = result.get("multiValueHeaders") or {}
        headers = [(k, v) for k, v in headers if k not in multi]
        headers += [(k, str(v)) for k, values in multi.items() for v in values]
        body = result.get("body") or ""
        data = base64.b64decode(body) if result.get("isBase64Encoded") else body.encode()
    except (ValueError, TypeError, AttributeError):
        return None
    return HttpResponse(status, headers, data)


def gateway_response(kind: str, responses: dict[str, Any]) -> HttpResponse:
    """An answer API Gateway gives itself (unknown route, failed function), shaped by the
    template's GatewayResponses when it has one for ``kind`` (or its DEFAULT_4XX/5XX)."""
    status, message = _DEFAULT_RESPONSES[kind]
    family = "DEFAULT_4XX" if status < 500 else "DEFAULT_5XX"
    custom = responses.get(kind) or responses.get(family) or {}
    status = int(custom.get("StatusCode", status))
    template = custom.get("ResponseTemplates", {}).get("application/json")
    if template is None:
        body = json.dumps({"message": message})
    else:  # the one variable our templates use; a JSON string literal, quotes included
        body = template.replace("$context.error.messageString", json.dumps(message))
    return HttpResponse(status, [("Content-Type", "application/json")], body.encode())

"""API Gateway REST (v1) proxy events, as API Gateway and `sam local` deliver them."""

from __future__ import annotations

import base64
import json
import re
import uuid
from typing import Any

from ops import template

_ROUTES: list[tuple[str, str]] | None = None


def routes() -> list[tuple[str, str]]:
    """(method, resource) of every Api event of the api function in template.yaml."""
    global _ROUTES
    if _ROUTES is None:
        props = template.resources("AWS::Serverless::Function")["ApiFunction"]
        _ROUTES = [
            (e["Properties"]["Method"].upper(), e["Properties"]["Path"])
            for e in props["Events"].values()
            if e["Type"] == "Api"
        ]
    return _ROUTES


def resource_of(method: str, path: str) -> tuple[str, dict[str, str]]:
    """The template resource a concrete path matches, and its path parameters."""
    for route_method, resource in routes():
        if route_method != method:
            continue
        pattern = "^" + re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", resource) + "$"
        match = re.match(pattern, path)
        if match:
            return resource, match.groupdict()
    return path, {}


def event(
    method: str,
    path: str,
    *,
    body: Any = None,
    raw_body: str | bytes | None = None,
    headers: dict[str, str] | None = None,
    query: dict[str, str] | None = None,
    base64_body: bool = False,
) -> dict[str, Any]:
    resource, params = resource_of(method, path)
    if raw_body is None and body is not None:
        raw_body = json.dumps(body)
    if isinstance(raw_body, bytes) or (base64_body and raw_body is not None):
        data = raw_body if isinstance(raw_body, bytes) else raw_body.encode()
        raw_body, encoded = base64.b64encode(data).decode(), True
    else:
        encoded = False
    hdrs = {"Content-Type": "application/json", "Host": "api.example.com", **(headers or {})}
    return {
        "resource": resource,
        "path": path,
        "httpMethod": method,
        "headers": hdrs,
        "multiValueHeaders": {k: [v] for k, v in hdrs.items()},
        "queryStringParameters": query or None,
        "multiValueQueryStringParameters": {k: [v] for k, v in query.items()} if query else None,
        "pathParameters": params or None,
        "stageVariables": None,
        "requestContext": {
            "resourcePath": resource,
            "httpMethod": method,
            "path": f"/prod{path}",
            "stage": "prod",
            "requestId": str(uuid.uuid4()),
            "accountId": "123456789012",
            "apiId": "abcdef1234",
            "protocol": "HTTP/1.1",
            "domainName": "api.example.com",
            "requestTimeEpoch": 1795255200000,
            "identity": {"sourceIp": "127.0.0.1", "userAgent": "pytest"},
        },
        "body": raw_body,
        "isBase64Encoded": encoded,
    }

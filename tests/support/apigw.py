"""API Gateway REST proxy events for in-process handler tests, built by the same code the
local stack's HTTP gateway uses (``ops.local.apigw``), routed by template.yaml's Api events."""

from __future__ import annotations

import json
from functools import cache
from typing import Any

from ops.local.apigw import proxy_event
from ops.local.spec import StackSpec, load_stack


@cache
def stack() -> StackSpec:
    # Routes only: the Redis endpoint variables just need a stand-in to resolve.
    return load_stack({"REDIS_URL": "redis://unused", "REDIS_CLUSTER": "false"})


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
    """The event for ``method path`` (a concrete path like /v1/timers/tmr_x)."""
    found = stack().route(method, path)
    resource, params = (found[0].resource, found[1]) if found else (path, {})
    if raw_body is None and body is not None:
        raw_body = json.dumps(body)
    data = raw_body.encode() if isinstance(raw_body, str) else raw_body
    hdrs = {"Content-Type": "application/json", "Host": "api.example.com", **(headers or {})}
    return proxy_event(
        method,
        path,
        resource=resource,
        path_params=params,
        stage="prod",
        headers=list(hdrs.items()),
        query=list((query or {}).items()),
        body=data,
        binary=base64_body,
    )

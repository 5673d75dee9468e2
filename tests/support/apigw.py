"""API Gateway HTTP API events (payload format 2.0) for in-process handler tests, built by the
same code the local stack's HTTP gateway uses (``ops.local.apigw``), routed by template.yaml's
HttpApi events (an unknown route or method gets the $default route, as in AWS)."""

from __future__ import annotations

import json
from functools import cache
from typing import Any
from urllib.parse import urlencode

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
    query: dict[str, str] | str | None = None,
    content_type: str | None = "application/json",
) -> dict[str, Any]:
    """The event for ``method path`` (a concrete path like /v1/timers/tmr_x).

    ``content_type`` is sent as the Content-Type header unless None (or ``headers`` names one);
    ``query`` is a mapping or a raw query string.
    """
    found = stack().route(method, path)
    assert found is not None, f"{method} {path}: the template routes nothing here"
    route, params = found
    if raw_body is None and body is not None:
        raw_body = json.dumps(body)
    data = raw_body.encode() if isinstance(raw_body, str) else raw_body
    hdrs = {"host": "api.example.com", "user-agent": "pytest"}
    if content_type is not None:
        hdrs["content-type"] = content_type
    hdrs |= {name.lower(): value for name, value in (headers or {}).items()}
    return proxy_event(
        method,
        path,
        route_key=route.key,
        path_params=params,
        stage=route.stage,
        headers=list(hdrs.items()),
        query=query if isinstance(query, str) else urlencode(query or {}),
        body=data,
    )

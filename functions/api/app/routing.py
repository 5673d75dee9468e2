"""Which methods each path serves, read from the OpenAPI document (powertools keeps its route
table private), and the 404 / 405 answers built from it.

The document is generated from the routes, so the table cannot drift from what the router
serves; tests/unit/test_template.py checks both against template.yaml's routes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from typing import Any

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.exceptions import NotFoundError

from .errors import error_response
from .openapi import PUBLIC_PATHS, openapi_schema
from .resolver import app
from .static_files import STATIC_PATHS

_METHOD_ORDER = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE")
_PATH_PARAMETER = re.compile(r"\{[^/}]+\}")


@dataclass(frozen=True)
class Operation:
    takes_body: bool  # a JSON request body: size, encoding and content type are checked first
    public: bool  # served without a key


@dataclass(frozen=True)
class _PathRoutes:
    pattern: re.Pattern[str]
    methods: dict[str, Operation]


def route_methods(path: str) -> dict[str, Operation]:
    """The methods the API serves on ``path`` (empty: no such path), each with its operation."""
    methods: dict[str, Operation] = {}
    for routes in _route_table():
        if routes.pattern.fullmatch(path):
            for method, operation in routes.methods.items():
                methods.setdefault(method, operation)
    return methods


@cache
def _route_table() -> tuple[_PathRoutes, ...]:
    document = openapi_schema().model_dump(by_alias=True, exclude_none=True)
    table = [
        _PathRoutes(_pattern(template), {
            method.upper(): Operation("requestBody" in operation, template in PUBLIC_PATHS)
            for method, operation in item.items()
        })
        for template, item in document.get("paths", {}).items()
    ]  # fmt: skip
    # Static files (GET, no body, no key) stay routes even where the document leaves them out.
    table += [_PathRoutes(_pattern(path), {"GET": Operation(False, True)}) for path in STATIC_PATHS]
    return tuple(table)


def _pattern(template: str) -> re.Pattern[str]:
    """``/v1/timers/{timer_id}`` -> a pattern matching one path segment per parameter."""
    literals = _PATH_PARAMETER.split(template)
    return re.compile("[^/]+".join(re.escape(literal) for literal in literals))


def route_error(method: str, path: str) -> Response[Any]:
    """404 for a path the API does not have; 405 with ``Allow`` for a method it does not
    serve on a path it has."""
    allowed = route_methods(path)
    if not allowed or method in allowed:
        return error_response(404, "not_found", "no such route")
    allow = ", ".join(sorted(allowed, key=_method_rank))
    response = error_response(
        405, "method_not_allowed", f"{method} is not allowed on {path}; it allows {allow}"
    )
    response.headers["Allow"] = allow
    return response


def _method_rank(method: str) -> tuple[int, str]:
    order = _METHOD_ORDER.index(method) if method in _METHOD_ORDER else len(_METHOD_ORDER)
    return order, method


@app.not_found
def route_not_found(exc: NotFoundError) -> Response[Any]:
    # The preflight answers unknown routes and methods first; this covers a path it lets
    # through that no handler's pattern accepts.
    event = app.current_event
    return route_error(event.http_method.upper(), event.path)

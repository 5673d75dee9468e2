"""Which methods each path serves, read from the resolver's routes, and the 404 / 405 answers
built from it.

Powertools keeps its route table private (``_static_routes``, ``_dynamic_routes``); the OpenAPI
document is generated from the same routes, but generating it costs a cold sandbox's first
request ~0.1 s of CPU (and its models' import), so the table reads the routes directly: a
route takes a body when its handler has a body parameter - what gives an operation of the
document its ``requestBody``. tests/unit/test_template.py checks the table against
template.yaml's routes, and tests/integration/test_openapi.py against the document.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from typing import Any

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.exceptions import NotFoundError

from .errors import error_response
from .openapi import PUBLIC_PATHS
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
    by_path: dict[str, dict[str, Operation]] = {}
    for route in [*app._static_routes, *app._dynamic_routes]:
        template = route.openapi_path  # /v1/timers/{timer_id}
        if template in STATIC_PATHS:  # static files: GET, no body, no key
            operation = Operation(False, True)
        else:
            operation = Operation(bool(route.dependant.body_params), template in PUBLIC_PATHS)
        by_path.setdefault(template, {})[route.method.upper()] = operation
    return tuple(_PathRoutes(_pattern(path), methods) for path, methods in by_path.items())


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

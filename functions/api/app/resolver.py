"""The API's resolver, its observability, and what every route reads: the runtime (clients and
settings) and the caller's tenant."""

from __future__ import annotations

from functools import cache
from typing import Any

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.event_handler import APIGatewayHttpResolver, Response, content_types

from timers.core import strict_json
from timers.runtime import Runtime, build_runtime
from timers.tenancy.table import Tenant

logger = Logger()
metrics = Metrics()
# Bodies are parsed once, strictly: NaN, lone surrogates, deep nesting are a 400 (strict_json).
app = APIGatewayHttpResolver(enable_validation=True, json_body_deserializer=strict_json.loads)


@cache
def tracer() -> Tracer:
    """The X-Ray tracer, made on the first request: making it imports the X-Ray SDK (even to
    disable it, as on the local stack), which a cold start's import need not wait for."""
    return Tracer()


_runtime: Runtime | None = None  # tests and the cost benchmark put theirs here


def runtime() -> Runtime:
    """Clients and settings, built once per cold start (not at import)."""
    global _runtime
    if _runtime is None:
        _runtime = build_runtime()
    return _runtime


def tenant() -> Tenant:
    """The caller, authenticated by the preflight (``preflight.check``)."""
    current: Tenant = app.context["tenant"]
    return current


def json_response(status: int, body: Any) -> Response[Any]:
    return Response(status_code=status, content_type=content_types.APPLICATION_JSON, body=body)

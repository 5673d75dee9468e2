"""HTTP API (API Gateway HTTP API, payload format 2.0 -> Lambda): the handler. Thin: the
preflight's checks, then the resolver's routes.

Every failure leaves as the contract's error body: ``{"error": {"code", "message", "details"}}``
- unknown routes and methods too: the HTTP API sends every request no route of the template
serves to this function (its ``$default`` route), and HTTP APIs have no gateway responses.

The package, by concern: ``routes/`` (one router per resource), ``static_files`` (the docs page
and the console), ``openapi`` (the document and its fix-ups), ``routing`` (methods per path,
404/405), ``preflight`` (route, key, rate and body checks before the resolver), ``errors`` (the
error body, in one place), ``operations`` (responses and parameters routes share) and
``resolver`` (the resolver, the runtime, the caller's tenant).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import cache
from typing import Any

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.logging import correlation_paths
from aws_lambda_powertools.utilities.typing import LambdaContext

from timers.core.errors import Unavailable

# errors and routing register their exception handlers on import
from . import errors, openapi, preflight, routing, static_files  # noqa: F401
from .deadline import Late, answer_by, deadline_ms
from .resolver import app, logger, metrics, tracer
from .routes import fires, groups, health, preview, tenant, timers

for _router in (health.router, openapi.router, tenant.router, timers.router, groups.router,
                fires.router, preview.router, static_files.router):  # fmt: skip
    app.include_router(_router)


@logger.inject_lambda_context(correlation_id_path=correlation_paths.API_GATEWAY_HTTP)
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    # A slow or cold api answers 503 with Retry-After, never the gateway's 500 (deadline).
    try:
        with answer_by(deadline_ms(event, context.get_remaining_time_in_millis())):
            return _traced()(event, context)
    except Late:
        logger.warning("answered 503: the request's time ran out", extra=_where(event))
        late = Unavailable("the service is busy and could not answer in time; retry shortly")
        return preflight.as_proxy_result(errors.domain_error(late))


def _where(event: dict[str, Any]) -> dict[str, Any]:
    context = event.get("requestContext") or {}
    arrived = context.get("timeEpoch")
    waited = None if not isinstance(arrived, int) else time.time_ns() // 1_000_000 - arrived
    return {"route": event.get("routeKey"), "since_arrival_ms": waited}


@cache
def _traced() -> Callable[[dict[str, Any], LambdaContext], dict[str, Any]]:
    """The handler traced: the tracer is made on the first request (resolver.tracer).
    Traces keep no bodies: responses carry webhook secrets, target headers and payloads, and
    an error's message can quote the request."""
    capture = tracer().capture_lambda_handler(capture_response=False, capture_error=False)
    traced: Callable[[dict[str, Any], LambdaContext], dict[str, Any]] = capture(
        metrics.log_metrics(_handle)
    )
    return traced


def _handle(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    app.clear_context()
    checked = preflight.check(event)
    if isinstance(checked, Response):
        return preflight.as_proxy_result(checked)
    return app.resolve(checked, context)


_handle.__name__ = "handler"  # the trace's subsegment is "## handler", as it always was

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

from typing import Any

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.logging import correlation_paths
from aws_lambda_powertools.utilities.typing import LambdaContext

# errors and routing register their exception handlers on import
from . import errors, openapi, preflight, routing, static_files  # noqa: F401
from .resolver import app, logger, metrics, tracer
from .routes import fires, groups, health, preview, tenant, timers

for _router in (health.router, openapi.router, tenant.router, timers.router, groups.router,
                fires.router, preview.router, static_files.router):  # fmt: skip
    app.include_router(_router)


@logger.inject_lambda_context(correlation_id_path=correlation_paths.API_GATEWAY_HTTP)
# Traces keep no bodies: responses carry webhook secrets, target headers and payloads, and an
# error's message can quote the request.
@tracer.capture_lambda_handler(capture_response=False, capture_error=False)
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    app.clear_context()
    checked = preflight.check(event)
    if isinstance(checked, Response):
        return preflight.as_proxy_result(checked)
    return app.resolve(checked, context)

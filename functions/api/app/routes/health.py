"""``GET /v1/health``: liveness, no key."""

from __future__ import annotations

from aws_lambda_powertools.event_handler.router import APIGatewayHttpRouter

from timers.api import response_models as m

from ..operations import errors, ok

HEALTH_PATH = "/v1/health"
TAG = "service"  # the docs page groups operations by it
router = APIGatewayHttpRouter()


@router.get(
    HEALTH_PATH,
    tags=[TAG],
    summary="Liveness",
    security=[],
    responses={**ok(200, "The service answers", m.HealthOut), **errors(405)},
)
def health() -> m.HealthOut:
    return m.HealthOut(status="ok")

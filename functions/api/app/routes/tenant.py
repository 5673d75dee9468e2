"""``/v1/tenant``: the caller's own tenant."""

from __future__ import annotations

from aws_lambda_powertools.event_handler.router import APIGatewayHttpRouter

from timers import http_models as m
from timers.adapters.tenants import summary
from timers.runtime import DAY_MS

from ..operations import KEYED, errors, ok
from ..resolver import runtime, tenant

TAG = "tenant"  # the docs page groups operations by it
router = APIGatewayHttpRouter()


@router.get(
    "/v1/tenant",
    tags=[TAG],
    responses={**ok(200, "The caller's tenant", m.TenantOut), **errors(*KEYED)},
    summary="Who am I",
)
def who_am_i() -> m.TenantOut:
    retention_days = runtime().service.changes.retention_ms // DAY_MS
    return m.TenantOut(**summary(tenant()), retention_days=retention_days)

"""``/v1/tenant``: the caller's own tenant, its API keys and its usage."""

from __future__ import annotations

from http import HTTPStatus
from typing import Annotated, Any
from urllib.parse import unquote

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.openapi.params import Query
from aws_lambda_powertools.event_handler.router import APIGatewayHttpRouter

from timers.api import request_models as req
from timers.api import response_models as m
from timers.core.times import format_ms
from timers.runtime import DAY_MS
from timers.tenancy.keys import ApiKey
from timers.tenancy.tenants import summary

from ..operations import BODY, KEYED, errors, ok
from ..resolver import json_response, runtime, tenant

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


def key_view(key: ApiKey) -> dict[str, Any]:
    return {
        "key_id": key.key_id,
        "created_at": format_ms(key.created_ms),
        "last_used_at": None if key.last_used_ms is None else format_ms(key.last_used_ms),
        "label": key.label,
    }


@router.get(
    "/v1/tenant/keys",
    tags=[TAG],
    responses={
        **ok(200, "The tenant's API keys (never their secrets)", m.KeyList),
        **errors(*KEYED),
    },
    summary="List the tenant's API keys",
)
def list_keys() -> m.KeyList:
    keys = runtime().tenants.list_keys(tenant().name)
    return m.KeyList(items=[m.KeyOut(**key_view(k)) for k in keys])


@router.post(
    "/v1/tenant/keys",
    tags=[TAG],
    responses={
        **ok(201, "The new key, with its secret `api_key` - shown this once", m.KeyCreatedOut),
        **errors(*BODY, 409),
    },
    summary="Create an API key (at most 10 per tenant)",
)
def create_key(body: req.KeyCreate) -> Response[m.KeyCreatedOut]:
    api_key, key = runtime().tenants.create_key(
        tenant().name, runtime().service.clock(), body.label
    )
    return json_response(HTTPStatus.CREATED, {**key_view(key), "api_key": api_key})


@router.delete(
    "/v1/tenant/keys/<key_id>",
    tags=[TAG],
    responses={
        **ok(204, "Revoked: a request with it is refused (401) within 1 s, in every sandbox"),
        **errors(*KEYED, 404, 409),
    },
    summary="Revoke an API key (never the tenant's last one: 409)",
)
def revoke_key(key_id: str) -> Response[None]:
    runtime().tenants.revoke_key_id(tenant().name, unquote(key_id))
    return Response(status_code=HTTPStatus.NO_CONTENT)


Month = Annotated[
    str | None,
    Query(
        description="YYYY-MM (UTC), at most this month; default: this month. A month out of "
        "range (2026-13) or in the future is 400 on month",
        max_length=16,
    ),
]


@router.get(
    "/v1/tenant/usage",
    tags=[TAG],
    responses={
        **ok(200, "The tenant's usage in a month (UTC)", m.UsageOut),
        **errors(*KEYED, 400),
    },
    summary="Usage: fires enqueued, delivered, failed and late; timers created and active",
)
def usage(month: Month = None) -> m.UsageOut:
    return m.UsageOut(**runtime().service.usage_of(tenant(), month))

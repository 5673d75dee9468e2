"""Fires: a timer's history, the tenant's failed fires, and their redelivery."""

from __future__ import annotations

from http import HTTPStatus
from typing import Annotated, Literal
from urllib.parse import unquote

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.openapi.params import Query
from aws_lambda_powertools.event_handler.router import APIGatewayHttpRouter

from timers.api import request_models as req
from timers.api import response_models as m
from timers.core.times import parse_ms

from ..operations import KEYED, ONE_TIMER, Cursor, Limit, errors, ok
from ..resolver import json_response, runtime, tenant

FireStatusFilter = Annotated[
    Literal["failed"], Query(description="Which fires: `failed` (the only one for now)")
]
Since = Annotated[
    req.Rfc3339 | None, Query(description="Only fires that failed at or after this instant")
]
Until = Annotated[
    req.Rfc3339 | None, Query(description="Only fires that failed at or before this instant")
]
IncludeRedelivered = Annotated[
    bool,
    Query(description="Also the failures redelivered since (`redelivered_at`); default: not"),
]
TAG = "fires"  # the docs page groups operations by it
router = APIGatewayHttpRouter()


@router.get(
    "/v1/timers/<timer_id>/fires",
    tags=[TAG],
    responses={**ok(200, "A page of the timer's fires", m.FireList), **errors(*ONE_TIMER, 400)},
    summary="A timer's fires, newest first",
)
def list_fires(timer_id: str, limit: Limit = 50, cursor: Cursor = None) -> m.FireList:
    return m.FireList(**runtime().service.fire_history(tenant(), timer_id, limit, cursor))


@router.get(
    "/v1/fires",
    tags=[TAG],
    responses={
        **ok(
            200,
            "A page of the tenant's failed fires (HTTP targets whose delivery gave up: at once, "
            "after the retry budget, waiting for a slot, or dead-lettered), newest first; a "
            "redelivered one only with `include_redelivered=true`. One request reads at most "
            "`limit` failures: without it a page can be short, even empty, with a "
            "`next_cursor` to go on from",
            m.FailedFireList,
        ),
        **errors(*KEYED, 400),
    },
    summary="The tenant's failed fires, newest first",
)
def list_failed_fires(
    status: FireStatusFilter,
    since: Since = None,
    until: Until = None,
    limit: Limit = 50,
    cursor: Cursor = None,
    include_redelivered: IncludeRedelivered = False,
) -> m.FailedFireList:
    window = (
        None if since is None else parse_ms(since),
        None if until is None else parse_ms(until),
    )
    failures = runtime().failures
    return m.FailedFireList(
        **failures.list_failed(tenant(), *window, limit, cursor, include_redelivered)
    )


@router.post(
    "/v1/timers/<timer_id>/fires/<fire_id>/redeliver",
    tags=[TAG],
    responses={
        **ok(
            202,
            "Redelivered: its message (same body, same fire id, so consumers still dedupe on "
            "webhook-id) is on the delivery queue again, for the timer's target as it is now, "
            "with a new retry budget from now; the fire's history shows it enqueued again",
            m.FailedFireOut,
        ),
        **errors(*ONE_TIMER, 409),
    },
    summary="Redeliver one failed fire",
)
def redeliver_fire(timer_id: str, fire_id: str) -> Response[m.FailedFireOut]:
    view = runtime().failures.redeliver(tenant(), timer_id, unquote(fire_id))
    return json_response(HTTPStatus.ACCEPTED, view)


@router.post(
    "/v1/timers/<timer_id>/fires:redeliver",
    tags=[TAG],
    responses={
        **ok(
            202,
            "Every failed fire of the timer not redelivered yet, redelivered: at most 100 per "
            "request (the newest; call again for more), found among the tenant's newest 10,000 "
            "failures",
            m.FailedFireBatchOut,
        ),
        **errors(*ONE_TIMER),
    },
    summary="Redeliver every failed fire of a timer",
)
def redeliver_fires(timer_id: str) -> Response[m.FailedFireBatchOut]:
    return json_response(HTTPStatus.ACCEPTED, runtime().failures.redeliver_all(tenant(), timer_id))


@router.post(
    "/v1/timers/<timer_id>/run",
    tags=[TAG],
    responses={
        **ok(
            202,
            "Fired once now, besides the schedule: its own fire id `<timer id>:<now epoch ms>`, "
            "enqueued (on the target queue, or the delivery queue for an HTTP target) before "
            "the answer; claimed like any fire, so it is sent once; it does not move "
            "`next_fire_at` nor count toward `max_fires`, and shows in the timer's fires",
            m.FireOut,
        ),
        **errors(*ONE_TIMER, 409, 503),
    },
    summary="Run now: one extra fire, whatever the timer's status",
)
def run_timer(timer_id: str) -> Response[m.FireOut]:
    return json_response(HTTPStatus.ACCEPTED, runtime().service.run_now(tenant(), timer_id))

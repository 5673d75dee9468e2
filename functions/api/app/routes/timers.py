"""``/v1/timers``: create (one or a batch), list, get, change, cancel, pause, resume, reset."""

from __future__ import annotations

from http import HTTPStatus
from typing import Annotated, Literal

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.openapi.params import Query
from aws_lambda_powertools.event_handler.router import APIGatewayHttpRouter

from timers.api import request_models as req
from timers.api import response_models as m
from timers.core.timer import serialize_payload

from ..operations import BODY, KEYED, ONE_TIMER, Cursor, IdempotencyKey, Limit, errors, ok
from ..resolver import json_response, runtime, tenant

StatusFilter = Annotated[
    Literal["active", "paused", "completed"] | None,
    Query(description="Only timers in this status"),
]
GroupFilter = Annotated[
    str | None,
    Query(description="Only the timers of this group (read from its index, not the whole list)"),
]
TAG = "timers"  # the docs page groups operations by it
router = APIGatewayHttpRouter()


@router.post(
    "/v1/timers",
    tags=[TAG],
    responses={
        **ok(201, "The timer (or, for a repeated Idempotency-Key, the first one)", m.TimerOut),
        **errors(*BODY, 409),
    },
    summary="Create a timer",
)
def create_timer(
    body: req.TimerCreate, idempotency_key: IdempotencyKey = None
) -> Response[m.TimerOut]:
    spec = req.to_spec(body, serialize_payload(body.payload))
    view = runtime().service.create(tenant(), spec, idempotency_key)
    return json_response(HTTPStatus.CREATED, view)


@router.post(
    "/v1/timers:batch",
    tags=[TAG],
    responses={
        **ok(201, "The timers, in the order of the request", m.TimerBatchOut),
        **errors(*BODY, 409),
    },
    summary="Create up to 100 timers at once, all or nothing",
)
def create_timers(
    body: req.TimerBatchIn, idempotency_key: IdempotencyKey = None
) -> Response[m.TimerBatchOut]:
    views = runtime().service.create_batch(tenant(), req.to_specs(body), idempotency_key)
    return json_response(HTTPStatus.CREATED, {"items": views})


@router.get(
    "/v1/timers",
    tags=[TAG],
    responses={
        **ok(
            200,
            "A page of the tenant's timers, by id. One request reads at most 1,000 "
            "timers: a page filtered by `status` can be short, even empty, with a "
            "`next_cursor` to go on from; the listing ends where `next_cursor` is null",
            m.TimerList,
        ),
        **errors(*KEYED, 400),
    },
    summary="List timers",
)
def list_timers(
    status: StatusFilter = None,
    group: GroupFilter = None,
    limit: Limit = 50,
    cursor: Cursor = None,
) -> m.TimerList:
    return m.TimerList(**runtime().service.list(tenant(), status, limit, cursor, group))


@router.get(
    "/v1/timers/<timer_id>",
    tags=[TAG],
    responses={**ok(200, "The timer", m.TimerOut), **errors(*ONE_TIMER)},
    summary="Get a timer",
)
def get_timer(timer_id: str) -> m.TimerOut:
    return m.TimerOut(**runtime().service.get(tenant(), timer_id))


@router.patch(
    "/v1/timers/<timer_id>",
    tags=[TAG],
    responses={**ok(200, "The changed timer", m.TimerOut), **errors(*BODY, 404, 409)},
    summary="Update a timer; its next fire is recomputed",
)
def patch_timer(timer_id: str, body: req.TimerPatch) -> m.TimerOut:
    payload = serialize_payload(body.payload) if "payload" in body.model_fields_set else None
    changes = req.to_changes(body, payload)
    return m.TimerOut(**runtime().service.patch(tenant(), timer_id, changes))


@router.delete(
    "/v1/timers/<timer_id>",
    tags=[TAG],
    responses={
        **ok(204, "Cancelled: it never fires again; a later GET is 404"),
        **errors(*ONE_TIMER, 409),
    },
    summary="Cancel a timer: it never fires again",
)
def delete_timer(timer_id: str) -> Response[None]:
    runtime().service.delete(tenant(), timer_id)
    return Response(status_code=HTTPStatus.NO_CONTENT, body=None)


@router.post(
    "/v1/timers/<timer_id>/pause",
    tags=[TAG],
    responses={**ok(200, "The timer, paused", m.TimerOut), **errors(*ONE_TIMER, 409)},
    summary="Pause: no fires while paused",
)
def pause_timer(timer_id: str) -> m.TimerOut:
    return m.TimerOut(**runtime().service.pause(tenant(), timer_id))


@router.post(
    "/v1/timers/<timer_id>/resume",
    tags=[TAG],
    responses={**ok(200, "The timer, active", m.TimerOut), **errors(*ONE_TIMER, 409)},
    summary="Resume; missed fires follow `misfire`",
)
def resume_timer(timer_id: str) -> m.TimerOut:
    return m.TimerOut(**runtime().service.resume(tenant(), timer_id))


@router.post(
    "/v1/timers/<timer_id>/reset",
    tags=[TAG],
    responses={
        **ok(200, "The timer, active again, its schedule restarted from now", m.TimerOut),
        **errors(*ONE_TIMER, 400, 409),
    },
    summary="Reset: restart the schedule from now, fire count 0, whatever the status",
    description="As if just created now with the same definition: `after` counts from now, "
    "`every` fires at now + period (or on its `start_at` series), `cron` and `at` at their "
    "next occurrence after now (an `at` already past: 400). A fire of the old schedule not "
    "yet sent when it answers never fires: one already claimed is waited for (a few hundred "
    "ms); if its run died, 409 `invalid_state` and nothing changed.",
)
def reset_timer(timer_id: str) -> m.TimerOut:
    return m.TimerOut(**runtime().service.reset(tenant(), timer_id))

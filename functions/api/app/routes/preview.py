"""``POST /v1/schedule-preview``: the next fire times of a schedule; creates nothing."""

from __future__ import annotations

from aws_lambda_powertools.event_handler.router import APIGatewayHttpRouter

from timers.api import request_models as req
from timers.api import response_models as m

from ..operations import BODY, errors, ok
from ..resolver import runtime

TAG = "schedules"  # the docs page groups operations by it
router = APIGatewayHttpRouter()


@router.post(
    "/v1/schedule-preview",
    tags=[TAG],
    responses={**ok(200, "The next fire times", m.PreviewOut), **errors(*BODY)},
    summary="The next fire times of a schedule; creates nothing",
)
def schedule_preview(body: req.PreviewIn) -> m.PreviewOut:
    service = runtime().service
    return m.PreviewOut(**service.preview(req.to_plan(body, service.clock()), body.count))

"""``/v1/groups``: the tenant's groups, and pause, resume or delete every timer of one."""

from __future__ import annotations

from urllib.parse import unquote

from aws_lambda_powertools.event_handler.router import APIGatewayHttpRouter

from timers.api import response_models as m

from ..operations import KEYED, Cursor, Limit, errors, ok
from ..resolver import runtime, tenant

TAG = "groups"  # the docs page groups operations by it
router = APIGatewayHttpRouter()
_STEPS = (
    "One call changes up to 500 timers (and goes through at most 2,000, or 5 s of work); "
    "while `done` is false, call again: the next call goes on where this one stopped. A timer "
    "already in the asked state is not counted in `changed`. Each timer's change is the single "
    "route's, so a fire not yet sent when its timer is changed never fires after it (one "
    "already being sent still goes). A timer created into the group while an operation runs "
    "may be missed by it. 404: this tenant has no timer in a group of that name"
)
_BAD_NAME = "validation_error (`group`): not 1-64 characters of A-Z a-z 0-9 . _ -"


@router.get(
    "/v1/groups",
    tags=[TAG],
    responses={
        **ok(200, "A page of the tenant's groups (those with a timer), by name", m.GroupList),
        **errors(*KEYED, 400),
    },
    summary="List the tenant's groups",
)
def list_groups(limit: Limit = 50, cursor: Cursor = None) -> m.GroupList:
    return m.GroupList(**runtime().groups.list(tenant(), limit, cursor))


def _operation(name: str, action: str) -> m.GroupChangeOut:
    view = runtime().groups.operate(tenant(), unquote(name), action)  # type: ignore[arg-type]
    return m.GroupChangeOut(**view)


_RESPONSES = {
    **errors(*KEYED, 404),
    400: {**errors(400)[400], "description": _BAD_NAME},
    409: {
        **errors(409)[409],
        "description": "concurrent_update: the group's first timer kept changing under the "
        "call; nothing was changed by it: retry",
    },
}


@router.post(
    "/v1/groups/<name>/pause",
    tags=[TAG],
    responses={**ok(200, "What this call paused", m.GroupChangeOut), **_RESPONSES},
    summary="Pause every timer of a group",
    description=_STEPS,
)
def pause_group(name: str) -> m.GroupChangeOut:
    return _operation(name, "pause")


@router.post(
    "/v1/groups/<name>/resume",
    tags=[TAG],
    responses={**ok(200, "What this call resumed", m.GroupChangeOut), **_RESPONSES},
    summary="Resume every timer of a group; missed fires follow each one's `misfire`",
    description=_STEPS,
)
def resume_group(name: str) -> m.GroupChangeOut:
    return _operation(name, "resume")


@router.delete(
    "/v1/groups/<name>",
    tags=[TAG],
    responses={**ok(200, "What this call deleted", m.GroupChangeOut), **_RESPONSES},
    summary="Delete every timer of a group; then the group is gone",
    description=_STEPS,
)
def delete_group(name: str) -> m.GroupChangeOut:
    return _operation(name, "delete")

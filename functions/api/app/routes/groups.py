"""``/v1/groups``: the tenant's groups, and pause, resume or delete every timer of one."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

from aws_lambda_powertools.event_handler.router import APIGatewayHttpRouter

from timers.api import response_models as m
from timers.core.groups import Action

from ..operations import KEYED, Cursor, Limit, errors, ok
from ..resolver import runtime, tenant

TAG = "groups"  # the docs page groups operations by it
router = APIGatewayHttpRouter()
Handler = Callable[..., Any]
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


_RESPONSES = {
    **errors(*KEYED, 404),
    400: {**errors(400)[400], "description": _BAD_NAME},
    409: {
        **errors(409)[409],
        "description": "concurrent_update: the group's first timer kept changing under the "
        "call; nothing was changed by it: retry",
    },
}


def _group_operation(
    action: Action,
    route: Callable[..., Callable[[Handler], Handler]],
    path: str,
    did: str,
    summary: str,
) -> Handler:
    """The route of one group operation: ``action`` on every timer of the group the path
    names. The handler is named ``<action>_group``: the OpenAPI operationId is made of it."""

    def operate(name: str) -> m.GroupChangeOut:
        view = runtime().groups.operate(tenant(), unquote(name), action)
        return m.GroupChangeOut(**view)

    operate.__name__ = operate.__qualname__ = f"{action}_group"
    responses = {**ok(200, f"What this call {did}", m.GroupChangeOut), **_RESPONSES}
    return route(path, tags=[TAG], responses=responses, summary=summary, description=_STEPS)(
        operate
    )


pause_group = _group_operation(
    "pause", router.post, "/v1/groups/<name>/pause", "paused", "Pause every timer of a group"
)
resume_group = _group_operation(
    "resume",
    router.post,
    "/v1/groups/<name>/resume",
    "resumed",
    "Resume every timer of a group; missed fires follow each one's `misfire`",
)
delete_group = _group_operation(
    "delete",
    router.delete,
    "/v1/groups/<name>",
    "deleted",
    "Delete every timer of a group; then the group is gone",
)

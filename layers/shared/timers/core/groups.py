"""Groups: a timer is in at most one, named by its ``group`` field. Pure rules; where a group's
timers are found is the timers table's index (timers.store.timers_table) and what the
tenant's groups are its registry (timers.api.groups_table).
"""

from __future__ import annotations

import re
from typing import Any, Literal

from timers.core.errors import FieldError, InvalidInput

GROUP_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")  # fullmatch: "$" matches before a "\n"
GROUP_RULE = "1 to 64 characters of A-Z a-z 0-9 . _ -"
Action = Literal["pause", "resume", "delete"]
ACTIONS: tuple[Action, ...] = ("pause", "resume", "delete")


def group_errors(value: Any, field: str = "group") -> list[FieldError]:
    """Why ``value`` is not a group name (empty: it is one)."""
    if not isinstance(value, str):
        return [FieldError(field, "must be a string (or null: in no group)")]
    if not GROUP_NAME.fullmatch(value):
        return [FieldError(field, f"must be {GROUP_RULE}")]
    return []


def check_group(value: Any, field: str = "group") -> None:
    """A timer's group: None (in no group) or a valid name."""
    if value is not None and (errors := group_errors(value, field)):
        raise InvalidInput("invalid group name", errors)


def check_name(value: Any, field: str = "group") -> str:
    """A group asked for by name (a path or a query): a valid name, never None."""
    if errors := group_errors(value, field):
        raise InvalidInput("invalid group name", errors)
    return str(value)


def index_key(tenant: str, group: str) -> str:
    """The group's key in the timers table's index: tenants are walled off by construction
    (a tenant name has no ``#``)."""
    return f"{tenant}#{group}"


def group_of(key: str | None) -> str | None:
    return None if key is None else key.partition("#")[2]

"""The API's listing cursors: opaque to clients, bound to the tenant and the listing they came
from, so one tenant's cursor is rejected for another (even though each query is already
scoped to its tenant)."""

from __future__ import annotations

import base64
import binascii
import json

from timers.core.errors import FieldError, InvalidInput
from timers.core.numbers import is_ascii_digits
from timers.tenancy.table import Tenant


def history_cursor(position: str) -> tuple[int | None, int | None]:
    """(where the chain goes on, the position extra fires are below) of a history cursor;
    a cursor of before extra fires is the chain's position alone."""
    chain, _, below = position.partition("|")
    if not all(is_ascii_digits(part) for part in (chain, below) if part):
        raise InvalidInput(
            "invalid cursor", [FieldError("cursor", "not a cursor this listing returned")]
        )
    return (int(chain) if chain else None), (int(below) if below else None)


def encode_cursor(position: str | None, tenant: Tenant, scope: str) -> str | None:
    if position is None:
        return None
    raw = json.dumps({"t": tenant.name, "s": scope, "p": position}, separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(cursor: str | None, tenant: Tenant, scope: str) -> str | None:
    if cursor is None:
        return None
    try:
        data = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        valid = data["t"] == tenant.name and data["s"] == scope and isinstance(data["p"], str)
    except (ValueError, KeyError, TypeError, binascii.Error):
        valid = False
    if not valid:
        raise InvalidInput(
            "invalid cursor", [FieldError("cursor", "not a cursor this listing returned")]
        )
    return str(data["p"])

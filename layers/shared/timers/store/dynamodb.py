"""What the code of every DynamoDB table shares: pynamodb models bound to a table, the
low-level client built on first use, and how a failed call is read."""

from __future__ import annotations

import types
from collections.abc import Mapping
from functools import cache
from typing import Any, TypeVar, cast

from pynamodb.models import Model

from timers.store import aws

aws.share_with_pynamodb()  # every model's connection: the service data parsed once

M = TypeVar("M", bound=Model)
Fields = Mapping[str, tuple[str, str]]  # dataclass field -> (map key, DynamoDB type)


@cache
def bound_model(schema: type[M], table: str, **settings: Any) -> type[M]:
    """``schema`` (a Model without a Meta: no table) on ``table``: a subclass with a Meta of its
    own, so it has its own table name and its own pynamodb connection (pynamodb keeps one per
    class), with pynamodb's ``settings`` (timeouts, retries). Built once per table: that
    connection holds a botocore client."""
    meta = type("Meta", (), {"table_name": table, **settings})
    body = {"Meta": meta, "__module__": schema.__module__}
    bound = types.new_class(schema.__name__, (schema,), exec_body=lambda ns: ns.update(body))
    return cast(type[M], bound)


class LowLevelClient:
    """``self.client``: the one given, else boto3's, built on first use - once per cold start,
    not at import (handlers import the tables' code before their environment is complete in
    tests)."""

    _client: Any = None

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = aws.client("dynamodb")
        return self._client


def condition_failed(exc: Exception) -> bool:
    """Whether a botocore client error was a write's condition not holding."""
    response = getattr(exc, "response", None) or {}
    return bool(response.get("Error", {}).get("Code") == "ConditionalCheckFailedException")


def failed_because(exc: Exception, code: str) -> bool:
    """Whether a pynamodb error was DynamoDB answering ``code``. (pynamodb's own
    ``cause_response_code`` fails with AttributeError when the cause was a timeout or a dropped
    connection: botocore leaves their ``response`` None.)"""
    response = getattr(getattr(exc, "cause", None), "response", None) or {}
    return bool(response.get("Error", {}).get("Code") == code)


def to_map(record: Any, fields: Fields) -> dict[str, Any]:
    """A dataclass as a DynamoDB map value; absent fields (None, False) left out."""
    out: dict[str, Any] = {}
    for name, (key, kind) in fields.items():
        value = getattr(record, name)
        if value is not None and not (kind == "BOOL" and not value):
            out[key] = {kind: value if kind in ("S", "BOOL") else str(value)}
    return {"M": out}


def from_map(value: Mapping[str, Any], fields: Fields) -> dict[str, Any]:
    stored = value["M"]
    return {
        name: int(stored[key][kind]) if kind == "N" else stored[key][kind]
        for name, (key, kind) in fields.items()
        if key in stored
    }

"""The low-level DynamoDB client the adapters share, built on first use."""

from __future__ import annotations

from typing import Any

import boto3


class LowLevelClient:
    """``self.client``: the one given, else boto3's, built on first use - once per cold start,
    not at import (handlers import adapters before their environment is complete in tests)."""

    _client: Any = None

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = boto3.client("dynamodb")
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

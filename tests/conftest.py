"""Suite-wide fixtures: fake AWS credentials, moto, and an injected clock."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

import boto3
import pytest
from moto import mock_aws

from ops import template

# Never reach a real account from a test, whatever the developer's shell has.
for _var in (
    "AWS_PROFILE",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_DYNAMODB",
    "AWS_ENDPOINT_URL_SQS",
):
    os.environ.pop(_var, None)
os.environ.update(
    AWS_DEFAULT_REGION="us-east-1",
    AWS_ACCESS_KEY_ID="testing",
    AWS_SECRET_ACCESS_KEY="testing",
    AWS_SESSION_TOKEN="testing",
    POWERTOOLS_METRICS_NAMESPACE="Timers",
    POWERTOOLS_SERVICE_NAME="timers",
    POWERTOOLS_TRACE_DISABLED="true",
)

T0 = 1_795_255_200_000  # 2026-11-21T10:00:00.000Z


@dataclass
class FakeClock:
    """The injected clock: epoch ms that only moves when a test moves it."""

    now: int = T0

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> int:
        self.now += ms
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def aws() -> Iterator[None]:
    """moto in-process, with every table of template.yaml created under its logical id."""
    with mock_aws():
        template.create_tables(boto3.client("dynamodb"))
        yield

"""Suite-wide fixtures: fake AWS credentials, moto (refusing what AWS refuses), and an injected
clock."""

from __future__ import annotations

from collections.abc import Iterator

import boto3
import pytest
from moto import mock_aws

from ops import template
from ops.aws_limits import aws_limits
from ops.offline import use_fake_aws
from tests.support.clock import FakeClock

pytest_plugins = ["tests.support.real_parts"]  # --redis, --dynamodb; the real parts' fixtures

use_fake_aws()  # never reach a real account from a test, whatever the developer's shell has


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def aws() -> Iterator[None]:
    """moto in-process, with DynamoDB's and SQS's limits, and every table of template.yaml
    created under its logical id."""
    with mock_aws(), aws_limits():
        template.create_tables(boto3.client("dynamodb"))
        yield

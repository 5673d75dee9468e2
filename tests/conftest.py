"""Suite-wide fixtures: fake AWS credentials, moto, and an injected clock."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import boto3
import pytest
from moto import mock_aws

from ops import template
from ops.offline import use_fake_aws

use_fake_aws()  # never reach a real account from a test, whatever the developer's shell has

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

"""The production-like parts as pytest fixtures, and the options that put a suite on them.

- ``redis_cluster``: a Redis Cluster of 3 masters + 3 replicas (``ops.redis_cluster``) for the
  session, with the operations that hurt it (kill a master, restart a node, migrate slots, lose
  a shard, flush).
- ``dynamodb_local``: Amazon's DynamoDB Local for the session (its endpoint URL), with the
  template's tables.

The tiers: a suite written against ``redis_target`` and ``aws_tables`` runs on the plain
redis-server and in-process moto by default, and on the real parts with

    pytest --redis=cluster --dynamodb=local tests/...      (make test-real: the marked ones)

``real_parts`` marks the tests that ``make test-real`` (and CI) run that way. Without Java or
the jar, the DynamoDB Local fixtures skip - unless ``TIMERS_REQUIRE_REAL_PARTS=1`` (CI), where
a missing part fails.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import boto3
import pytest
from moto import mock_aws
from pynamodb.models import Model

from ops import template
from ops.dynamodb_local import (
    DynamoDBLocal,
    MissingDependency,
    find_jar,
    find_java,
    reset_tables,
)
from ops.redis_cluster import LocalRedisCluster
from timers.config import Settings
from timers.runtime import redis_client


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("real parts", "production-like parts instead of emulators")
    group.addoption(
        "--redis",
        choices=("plain", "cluster"),
        default="plain",
        help="redis_target: one redis-server (default) or a 3+3 Redis Cluster",
    )
    group.addoption(
        "--dynamodb",
        choices=("moto", "local"),
        default="moto",
        help="aws_tables: DynamoDB in moto (default) or Amazon's DynamoDB Local",
    )


def _missing(reason: str) -> None:
    if os.environ.get("TIMERS_REQUIRE_REAL_PARTS") == "1":
        pytest.fail(reason)
    pytest.skip(reason)


def require_dynamodb_local() -> None:
    """Skip (fail under TIMERS_REQUIRE_REAL_PARTS=1) without Java 17 or the jar."""
    try:
        find_java(), find_jar()
    except MissingDependency as exc:
        _missing(str(exc))


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[LocalRedisCluster]:
    """3 masters + 3 replicas on free ports; each test that hurts it leaves it settled."""
    with LocalRedisCluster.start(3) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def dynamodb_local() -> Iterator[str]:
    """DynamoDB Local's endpoint URL (in memory, the template's tables created)."""
    try:
        server = DynamoDBLocal.start()
    except MissingDependency as exc:
        _missing(str(exc))
    with server:
        yield server.endpoint


@dataclass(frozen=True)
class RedisTarget:
    """Where a suite's Redis is: what the functions read from REDIS_URL and REDIS_CLUSTER."""

    url: str
    cluster: bool

    def settings(self, **fields: Any) -> Settings:
        return template.local_settings(redis_url=self.url, redis_cluster=self.cluster, **fields)

    def client(self) -> Any:
        """A client as the functions build theirs (redis.RedisCluster in cluster mode)."""
        return redis_client(self.settings())


@pytest.fixture(scope="session")
def redis_target(request: pytest.FixtureRequest) -> RedisTarget:
    """``--redis=plain`` (default): the suite's redis-server (the ``redis_url`` fixture of
    tests/integration and tests/stateful); ``--redis=cluster``: the session's Redis Cluster."""
    if request.config.getoption("redis") == "cluster":
        cluster: LocalRedisCluster = request.getfixturevalue("redis_cluster")
        return RedisTarget(cluster.url, cluster=True)
    return RedisTarget(request.getfixturevalue("redis_url"), cluster=False)


@pytest.fixture(scope="session")
def dynamodb_endpoint(request: pytest.FixtureRequest) -> str | None:
    """None for moto (``--dynamodb=moto``, default), else DynamoDB Local's endpoint."""
    if request.config.getoption("dynamodb") == "local":
        endpoint: str = request.getfixturevalue("dynamodb_local")
        return endpoint
    return None


@pytest.fixture
def aws_tables(
    dynamodb_endpoint: str | None, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str | None]:
    """What the ``aws`` fixture gives (moto in-process, the template's tables, empty), with
    DynamoDB on DynamoDB Local under ``--dynamodb=local``: SQS and the rest stay on moto,
    botocore and pynamodb reach DynamoDB Local through AWS_ENDPOINT_URL_DYNAMODB (moto lets
    requests to it through). Yields the DynamoDB endpoint, None for moto."""
    with mock_aws():
        if dynamodb_endpoint is None:
            template.create_tables(boto3.client("dynamodb"))
            yield None
        else:
            with dynamodb_at(dynamodb_endpoint, monkeypatch):
                yield dynamodb_endpoint


@contextmanager
def dynamodb_at(endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """DynamoDB calls of this process (boto3 and pynamodb) go to ``endpoint``, whose tables
    are emptied first; inside mock_aws the other services stay on moto."""
    monkeypatch.setenv("AWS_ENDPOINT_URL_DYNAMODB", endpoint)
    reset_tables(endpoint)
    forget_pynamodb_clients()
    try:
        yield
    finally:
        monkeypatch.delenv("AWS_ENDPOINT_URL_DYNAMODB")
        forget_pynamodb_clients()


def forget_pynamodb_clients() -> None:
    """pynamodb keeps each model's botocore client for the process: drop them, so the next
    DynamoDB call builds one where the environment points now (moto or DynamoDB Local)."""
    todo = list(Model.__subclasses__())
    while todo:
        model = todo.pop()
        todo += model.__subclasses__()
        model._connection = None

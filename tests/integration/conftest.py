"""Integration fixtures: one real redis-server per test session (or the one REDIS_URL names)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from ops.redis_server import RedisServer, start_redis


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    server = start_redis()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    """A client on an emptied server: every test starts from FLUSHALL, as after a failover."""
    client = redis.Redis.from_url(redis_url)
    client.flushall()
    try:
        yield client
    finally:
        client.close()


@pytest.fixture(scope="session")
def redis_cluster_url() -> Iterator[str]:
    """A one-node cluster-mode server: it rejects cross-slot scripts like ElastiCache does."""
    server = RedisServer.start(cluster=True)
    try:
        yield server.url
    finally:
        server.stop()

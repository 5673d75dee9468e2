"""What a cold start imports: each function's handler module, imported in a fresh interpreter
with the environment the local stack gives it (``bench.imports``), leaves the heavy modules
no request of it needs unloaded. Sets of modules, not timings: the CPU it takes is measured by
``python -m bench.imports`` (docs/api-performance.md)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from functools import cache
from typing import Any

import pytest

from bench.imports import function_specs, import_once
from ops.template import ROOT

NEVER = {
    # X-Ray: the api makes its tracer on the first request; the others do not trace.
    "aws_xray_sdk",
    # redis's asyncio client: redis/__init__ imports it, timers.deferred_imports defers it.
    "redis.asyncio",
    # boto3 (and s3transfer): clients are botocore's (timers.store.aws).
    "boto3",
    "s3transfer",
}
FIRE_PATH_NEVER = NEVER | {
    "pydantic",  # the API's models
    "aws_lambda_powertools.event_handler",  # the HTTP resolver
}
API_NEVER = NEVER | {
    "timers.engine.trigger",  # run now takes only the trigger's clock (timers.core.clock)
    "timers.engine.fanout",
    "timers.engine.migrate",
}


@cache
def loaded_by(function: str, modules: frozenset[str]) -> set[str]:
    spec: dict[str, Any] = {**function_specs()[function], "heavy": sorted(modules)}
    return set(import_once(spec)["heavy"])


@pytest.mark.parametrize(
    "function", ["TriggerFunction", "FanoutFunction", "MigratorFunction", "DeliveryFunction"]
)
def test_a_fire_path_handler_imports_no_api_tracing_or_async_code(function: str) -> None:
    assert loaded_by(function, frozenset(FIRE_PATH_NEVER)) == set()


def test_the_api_handler_imports_no_tracer_async_client_or_fire_path_core() -> None:
    assert loaded_by("ApiFunction", frozenset(API_NEVER)) == set()


def test_the_deferred_asyncio_package_still_works_when_used() -> None:
    """After ``import redis`` its asyncio package is there but not run; the first use of it
    runs it, and it is the package it always was."""
    code = textwrap.dedent(
        """
        import sys
        import timers
        import redis
        from timers.deferred_imports import initialized
        assert not initialized("redis.asyncio") and "redis.asyncio.client" not in sys.modules
        assert redis.Redis and redis.RedisCluster  # the sync clients are all there
        from redis.asyncio import Redis, RedisCluster
        import redis.asyncio.client
        assert initialized("redis.asyncio") and Redis is redis.asyncio.client.Redis
        assert RedisCluster.__module__ == "redis.asyncio.cluster"
        try:
            redis.asyncio.no_such_name
        except AttributeError:
            pass
        else:
            raise AssertionError("an unknown name must be an AttributeError")
        print("ok")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT / "layers" / "shared"), "PATH": "/usr/bin:/bin"},
        timeout=60,
    )
    assert done.stdout.strip() == "ok", done.stderr

"""``REDIS_SHARDS=3 DYNAMODB=local make run``: the whole service on a Redis Cluster of 3 masters
+ 3 replicas (the functions in cluster mode, as on AWS) and on Amazon's DynamoDB Local, reached
only as a user reaches it - over HTTP, ``make tenant`` and the tenants' SQS queues.

One stack serves the module. It runs on the wall clock, so these tests poll queues with
deadlines; nothing here asserts a duration.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
import redis

from ops.dynamodb_local import client as dynamodb_client
from tests.support.admin_commands import (
    admin_fails,
    admin_ok,
    check_every_admin_command,
    user_shell,
)
from tests.support.callbacks import drain
from tests.support.local_stack import (
    RunningStack,
    admin,
    descendants,
    real_parts_env,
    start_stack,
)
from tests.support.real_parts import require_dynamodb_local

pytestmark = [pytest.mark.e2e, pytest.mark.real_parts]

DEMO_KEY = "tk_e2e-real-parts-key-0123456789abcdefghijkl"
DELIVERY_TIMEOUT_S = 60.0
RECOVERY_TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningStack]:
    require_dynamodb_local()
    running = start_stack(
        tmp_path_factory.mktemp("real-parts-stack"),
        TIMERS_DEMO_API_KEY=DEMO_KEY,
        **real_parts_env(),
    )
    try:
        running.wait_ready()
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="module")
def sqs(stack: RunningStack) -> Any:
    return boto3.client(
        "sqs",
        endpoint_url=stack.aws_endpoint,
        region_name="us-east-1",
        aws_access_key_id="local",
        aws_secret_access_key="local",
    )


def create(stack: RunningStack, schedule: dict[str, Any], **extra: Any) -> dict[str, Any]:
    status, timer, _ = stack.request(
        "POST", "/timers", key=DEMO_KEY, body={"schedule": schedule, **extra}
    )
    assert status == 201, timer
    return dict(timer)


def callbacks_of(sqs: Any, queue: str, timer_ids: set[str], want: int) -> list[dict[str, Any]]:
    """Drain the queue until ``want`` callbacks of ``timer_ids`` arrived (others are dropped)."""
    got: list[dict[str, Any]] = []
    deadline = time.monotonic() + DELIVERY_TIMEOUT_S
    while time.monotonic() < deadline:
        got += [b for b in drain(sqs, queue, None) if b["timer_id"] in timer_ids]
        if len(got) >= want:
            return got
        time.sleep(0.2)  # polling a queue the stack fills on the wall clock
    raise AssertionError(f"{len(got)} of {want} callbacks after {DELIVERY_TIMEOUT_S}s: {got}")


def test_ready_lines_name_the_cluster_and_dynamodb_local(stack: RunningStack) -> None:
    env = stack.env
    base, dynamodb_port = int(env["REDIS_PORT"]), int(env["DYNAMODB_PORT"])
    assert stack.ready["DynamoDB endpoint: "] == f"http://127.0.0.1:{dynamodb_port}"
    assert stack.ready["Redis: "] == (
        f"redis://127.0.0.1:{base}/0 (cluster: 3 masters + 3 replicas on {base}-{base + 5})"
    )
    state = json.loads((Path(env["LOCAL_STATE_DIR"]) / "stack.json").read_text())
    assert state["dynamodb_endpoint"] == f"http://127.0.0.1:{dynamodb_port}"
    assert state["redis_cluster"] is True
    # The tables live in DynamoDB Local, not in moto.
    tables = dynamodb_client(state["dynamodb_endpoint"]).list_tables()["TableNames"]
    assert "TimersTable" in tables
    cluster = redis.RedisCluster.from_url(state["redis_url"])
    try:
        assert len(cluster.get_primaries()) == 3
    finally:
        cluster.close()


def test_a_timer_created_over_http_calls_back_on_the_demo_queue(
    stack: RunningStack, sqs: Any
) -> None:
    once = create(stack, {"type": "after", "seconds": 2}, payload={"on": "cluster"})
    every = create(stack, {"type": "every", "seconds": 1}, max_fires=3)
    queue = stack.ready["Tenant demo callback queue: "]

    got = callbacks_of(sqs, queue, {once["id"], every["id"]}, 4)

    assert [b["payload"] for b in got if b["timer_id"] == once["id"]] == [{"on": "cluster"}]
    assert len({b["fire_id"] for b in got if b["timer_id"] == every["id"]}) == 3
    status, fires, _ = stack.request("GET", f"/timers/{once['id']}/fires", key=DEMO_KEY)
    assert status == 200 and [f["status"] for f in fires["items"]] == ["enqueued"]


def test_make_tenant_works_against_dynamodb_local(stack: RunningStack) -> None:
    made = admin(stack, "tenant", "create", "acme")
    assert made["tenant"] == "acme" and made["api_key"].startswith("tk_")
    assert admin(stack, "tenant", "create", "demo")["api_key"] == DEMO_KEY  # read from state
    status, body, _ = stack.request("GET", "/tenant", key=made["api_key"])
    assert (status, body["tenant"]) == (200, "acme")


def test_every_admin_command_works_against_dynamodb_local(stack: RunningStack) -> None:
    """From the shell that ran ``REDIS_SHARDS=3 DYNAMODB=local make run`` with its own ports
    (AWS_PORT exported): the tables are on DynamoDB Local, never on moto at AWS_PORT."""
    check_every_admin_command(stack, "admin-real-parts")
    # Without the state file, the shell's DYNAMODB=local and DYNAMODB_PORT say where it is ...
    elsewhere = user_shell(stack, LOCAL_STATE_DIR="/nonexistent")
    assert admin_ok(stack, "tenant", "show", "admin-real-parts", env=elsewhere)["spread"] == 4
    # ... and without them, moto at AWS_PORT has no tables: one line says so.
    on_moto = {k: v for k, v in elsewhere.items() if k != "DYNAMODB"}
    line = admin_fails(stack, "tenant", "show", "admin-real-parts", env=on_moto)
    assert line.startswith(f"ops.admin: no table TenantsTable at {stack.aws_endpoint} ")


def test_a_dead_master_is_replaced_and_timers_keep_firing(stack: RunningStack, sqs: Any) -> None:
    base = int(stack.env["REDIS_PORT"])
    cluster = redis.RedisCluster.from_url(f"redis://127.0.0.1:{base}/0")
    try:
        master = cluster.get_node_from_key("{any}")
        victim = int(master.port)
    finally:
        cluster.close()
    pid = next(p for p in descendants(stack.process.pid) if node_port(p) == victim)

    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + RECOVERY_TIMEOUT_S
    while not any(f"127.0.0.1:{victim} is back" in line for line in stack.lines):
        assert stack.process.poll() is None, stack.stderr
        assert time.monotonic() < deadline, stack.lines[-10:]
        time.sleep(0.2)  # the cluster fails over and the stack restarts the node

    assert any(f"127.0.0.1:{victim} exited" in line for line in stack.lines)
    timer = create(stack, {"type": "after", "seconds": 1}, payload="after the failover")
    got = callbacks_of(sqs, stack.ready["Tenant demo callback queue: "], {timer["id"]}, 1)
    assert got[0]["payload"] == "after the failover"


def node_port(pid: int) -> int | None:
    """The port of the redis-server ``pid`` is (it names itself 'redis-server 127.0.0.1:P')."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return None
    found = re.match(r"\S*redis-server 127\.0\.0\.1:(\d+)", cmdline)
    return int(found.group(1)) if found else None

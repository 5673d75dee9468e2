"""How the local stack ends: Ctrl-C, a busy port, a missing piece, a component that dies.

Every way out leaves nothing running: no child process, no bound port, no state file.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ops.ports import free_port, port_is_free
from ops.redis_cluster import BUS_OFFSET
from ops.template import ROOT
from tests.support.local_stack import (
    RunningStack,
    admin,
    alive,
    descendants,
    real_parts_env,
    stack_env,
    start_stack,
)

pytestmark = pytest.mark.e2e

EXIT_TIMEOUT_S = 30.0
DEMO_KEY = "tk_lifecycle-demo-key-0123456789abcdefghijk"


def assert_nothing_left(stack: RunningStack, children: set[int]) -> None:
    # Killed children take a moment to be reaped (multiprocessing's resource tracker leaves
    # once the last sandbox holding its pipe is gone), so poll instead of racing them.
    deadline = time.monotonic() + 10
    while (left := [pid for pid in children if alive(pid)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"outlived the stack: {[cmdline(pid) for pid in left]}"
    assert all(port_is_free(port) for port in stack.ports)
    assert not (Path(stack.env["LOCAL_STATE_DIR"]) / "stack.json").exists()


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:120]
    except OSError:
        return f"pid {pid} (gone)"


def one_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    return lines[0]


def test_ctrl_c_stops_everything(tmp_path: Path) -> None:
    stack = start_stack(tmp_path)
    stack.wait_ready()
    children = descendants(stack.process.pid)
    assert len(children) >= 6  # redis-server, moto, a sandbox per function
    assert (tmp_path / "stack.json").exists()

    code, stderr = stack.stop(signal.SIGINT, timeout=EXIT_TIMEOUT_S)

    assert code == 0, stderr
    assert stack.lines[-1].endswith("local stack stopped")
    assert_nothing_left(stack, children)


@pytest.mark.parametrize("busy", ["API_PORT", "AWS_PORT", "REDIS_PORT"])
def test_a_busy_port_fails_at_once_with_one_line(tmp_path: Path, busy: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        stack = start_stack(tmp_path, **{busy: str(port)})
        code, stderr = stack.wait(EXIT_TIMEOUT_S), stack.stderr

    assert code != 0
    assert one_line(stderr) == f"local stack stopped: port {port} ({busy}) is already in use"
    assert not any(line.startswith("API: ") for line in stack.lines)


def test_a_missing_redis_server_fails_with_one_line(tmp_path: Path) -> None:
    stack = start_stack(tmp_path, REDIS_SERVER=str(tmp_path / "no-such-redis-server"))
    code, stderr = stack.wait(EXIT_TIMEOUT_S), stack.stderr

    assert code != 0
    assert "redis-server" in one_line(stderr)
    assert_nothing_left(stack, set())


def test_a_component_that_dies_stops_the_stack_with_one_line(tmp_path: Path) -> None:
    stack = start_stack(tmp_path)
    stack.wait_ready()
    children = descendants(stack.process.pid)
    redis_pid = next(
        pid for pid in children if b"redis-server" in Path(f"/proc/{pid}/cmdline").read_bytes()
    )

    os.kill(redis_pid, signal.SIGKILL)
    code, stderr = stack.wait(EXIT_TIMEOUT_S), stack.stderr

    assert code != 0
    assert one_line(stderr).startswith("local stack stopped: redis-server exited")
    assert_nothing_left(stack, children)


@pytest.mark.parametrize(
    ("settings", "reason"),
    [
        ({"REDIS_SHARDS": "2"}, "REDIS_SHARDS='2' is not 1 (one redis-server) or a cluster of 3"),
        ({"REDIS_SHARDS": "9"}, "REDIS_SHARDS='9' is not 1"),
        ({"REDIS_SHARDS": "x"}, "REDIS_SHARDS='x' is not 1"),
        ({"DYNAMODB": "foo"}, "DYNAMODB='foo' is not local (DynamoDB Local) or moto"),
        ({"DYNAMODB": "local", "JAVA_HOME": "/nonexistent"}, "missing dependency: no java"),
        ({"DYNAMODB": "local", "DYNAMODB_LOCAL_JAR": "/nonexistent.jar"}, "missing dependency"),
    ],
)
def test_bad_real_parts_settings_fail_at_once_with_one_line(
    tmp_path: Path, settings: dict[str, str], reason: str
) -> None:
    stack = start_stack(tmp_path, **settings)
    code, stderr = stack.wait(EXIT_TIMEOUT_S), stack.stderr

    assert code != 0
    assert one_line(stderr).startswith(f"local stack stopped: {reason}")
    assert_nothing_left(stack, set())


@pytest.mark.parametrize(
    "busy", ["REDIS_PORT+3", "the cluster bus of REDIS_PORT+1", "DYNAMODB_PORT"]
)
def test_a_busy_port_anywhere_in_the_real_parts_fails_with_one_line(
    tmp_path: Path, busy: str
) -> None:
    env = real_parts_env()
    base = int(env["REDIS_PORT"])
    port = {
        "REDIS_PORT+3": base + 3,
        "the cluster bus of REDIS_PORT+1": base + 1 + BUS_OFFSET,
        "DYNAMODB_PORT": int(env["DYNAMODB_PORT"]),
    }[busy]
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        stack = start_stack(tmp_path, **env)
        code, stderr = stack.wait(EXIT_TIMEOUT_S), stack.stderr

    assert code != 0
    assert one_line(stderr) == f"local stack stopped: port {port} ({busy}) is already in use"
    assert_nothing_left(stack, set())


def test_a_second_stack_that_fails_leaves_the_running_ones_files_alone(tmp_path: Path) -> None:
    first = start_stack(tmp_path, TIMERS_DEMO_API_KEY=DEMO_KEY)
    first.wait_ready()
    try:
        logs = sorted(p.name for p in (tmp_path / "logs").glob("*.log"))
        # `make run` again in the same directory, ports and all: it must fail and touch nothing
        second = start_stack(tmp_path, **{k: first.env[k] for k in first.env if k.endswith("PORT")})
        code, stderr = second.wait(EXIT_TIMEOUT_S), second.stderr

        assert code != 0
        assert one_line(stderr).startswith(
            f"local stack stopped: a local stack is already running from {tmp_path} "
            f"(pid {first.process.pid}, API {first.api})"
        )
        assert (tmp_path / "stack.json").exists()
        assert sorted(p.name for p in (tmp_path / "logs").glob("*.log")) == logs
        # `make tenant` and the CLI still find it, and the demo key
        assert admin(first, "tenant", "create", "demo")["api_key"] == DEMO_KEY
        whoami = subprocess.run(
            [str(Path(sys.executable).parent / "timers"), "--json", "whoami"],
            env={"PATH": os.environ["PATH"], "LOCAL_STATE_DIR": str(tmp_path)},
            capture_output=True,
            text=True,
            cwd="/",
        )
        assert json.loads(whoami.stdout)["tenant"] == "demo", whoami.stderr
    finally:
        code, stderr = first.stop(timeout=EXIT_TIMEOUT_S)
    assert code == 0, stderr
    assert not (tmp_path / "stack.json").exists()


def test_make_tenant_without_a_running_stack_says_to_start_one(tmp_path: Path) -> None:
    port = free_port()
    env = stack_env(tmp_path, AWS_PORT=str(port))
    done = subprocess.run(
        [sys.executable, "-m", "ops.admin", "tenant", "create", "acme"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )

    assert done.returncode == 1
    assert one_line(done.stderr) == (
        f"ops.admin: no local stack answers at http://127.0.0.1:{port}: start one with make run "
        "(or ENV=aws for the deployed stack)"
    )


def test_ports_a_killed_stack_left_held_are_named_with_what_to_kill(tmp_path: Path) -> None:
    killed = start_stack(tmp_path)
    killed.wait_ready()
    children = descendants(killed.process.pid)
    killed.process.kill()  # kill -9: no stop, its redis-server and moto stay
    killed.wait(EXIT_TIMEOUT_S)
    try:
        left = [pid for pid in children if alive(pid) and os.getpgid(pid) == pid]
        assert left, "nothing outlived the killed stack"
        again = start_stack(
            tmp_path, **{k: killed.env[k] for k in killed.env if k.endswith("PORT")}
        )
        code, stderr = again.wait(EXIT_TIMEOUT_S), again.stderr

        assert code != 0
        line = one_line(stderr)
        assert line.startswith(f"local stack stopped: port {killed.env['AWS_PORT']} (AWS_PORT)")
        assert "held by what a local stack that was killed left running" in line
        assert line.endswith(f"kill {' '.join(map(str, sorted(left)))}, then start again")
    finally:
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

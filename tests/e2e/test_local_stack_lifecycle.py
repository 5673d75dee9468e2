"""How the local stack ends: Ctrl-C, a busy port, a missing piece, a component that dies.

Every way out leaves nothing running: no child process, no bound port, no state file.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path

import pytest

from ops.ports import port_is_free
from tests.support.local_stack import (
    RunningStack,
    alive,
    descendants,
    start_stack,
)

pytestmark = pytest.mark.e2e

EXIT_TIMEOUT_S = 30.0


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

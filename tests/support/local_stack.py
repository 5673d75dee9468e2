"""Start ``python -m ops.local`` (what ``make run`` runs) as a user would, on free ports."""

from __future__ import annotations

import http.client
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ops.ports import free_ports
from ops.redis_cluster import BUS_OFFSET, free_range
from ops.template import ROOT

READY_TIMEOUT_S = 180.0  # a cold start of four sandboxes plus moto on a busy 2-core runner
READY_PREFIXES = (
    "API: ",
    "Console: ",
    "AWS endpoint: ",
    "DynamoDB endpoint: ",
    "Redis: ",
    "Tenant demo API key: ",
    "Tenant demo callback queue: ",
)


def descendants(pid: int) -> set[int]:
    """Every process below ``pid`` (Linux /proc)."""
    found: set[int] = set()
    todo = [pid]
    while todo:
        parent = todo.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            try:
                children = (task / "children").read_text().split()
            except OSError:
                continue
            for child in map(int, children):
                if child not in found:
                    found.add(child)
                    todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def real_parts_env(shards: int = 3) -> dict[str, str]:
    """The settings of a stack on the production-like parts, on free ports: DynamoDB Local's
    just after the nodes', all below the range the OS hands out, so none is one of the ports
    stack_env asks the OS for."""
    base = free_range(2 * shards + 1)
    return {
        "REDIS_SHARDS": str(shards),
        "REDIS_PORT": str(base),
        "DYNAMODB": "local",
        "DYNAMODB_PORT": str(base + 2 * shards),
    }


def stack_env(state_dir: Path, **overrides: str) -> dict[str, str]:
    """The environment of a fresh shell: none of the test suite's AWS or Redis settings."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AWS_", "REDIS_", "TIMERS_", "POWERTOOLS_"))
        and k not in ("DYNAMODB", "DYNAMODB_PORT")
    }
    api, aws, redis, dynamodb = free_ports(4)
    env.update(
        API_PORT=str(api),
        AWS_PORT=str(aws),
        REDIS_PORT=str(redis),
        DYNAMODB_PORT=str(dynamodb),  # used with DYNAMODB=local
        LOCAL_STATE_DIR=str(state_dir),
        PYTHONUNBUFFERED="1",
    )
    env.update(overrides)
    return env


@dataclass
class RunningStack:
    process: subprocess.Popen[str]
    env: dict[str, str]
    lines: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # stderr, as it arrives
    _pumps: list[threading.Thread] = field(default_factory=list)
    ready: dict[str, str] = field(default_factory=dict)
    _stdout: queue.Queue[str | None] = field(default_factory=queue.Queue)

    @property
    def api(self) -> str:
        return self.ready["API: "]

    @property
    def console(self) -> str:
        return self.ready["Console: "]

    @property
    def aws_endpoint(self) -> str:
        return self.ready["AWS endpoint: "]

    @property
    def ports(self) -> list[int]:
        """API, AWS, Redis (a cluster's nodes and their bus ports) and DynamoDB Local's."""
        ports = [int(self.env[name]) for name in ("API_PORT", "AWS_PORT", "REDIS_PORT")]
        setting = self.env.get("REDIS_SHARDS", "1")
        shards = int(setting) if setting in {str(n) for n in range(3, 9)} else 1
        if shards > 1:
            nodes = range(ports[2], ports[2] + 2 * shards)
            ports[2:] = [*nodes, *(port + BUS_OFFSET for port in nodes)]
        if self.env.get("DYNAMODB") == "local":
            ports.append(int(self.env["DYNAMODB_PORT"]))
        return ports

    def wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while len(self.ready) < len(READY_PREFIXES):
            try:
                line = self._stdout.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"not ready in {READY_TIMEOUT_S}s: {self.lines}") from None
            if line is None:
                self.wait(10)
                raise AssertionError(f"stack exited before ready: {self.lines} {self.stderr}")
            for prefix in READY_PREFIXES:
                if line.startswith(prefix):
                    self.ready[prefix] = line[len(prefix) :]

    def stop(self, signum: int = signal.SIGINT, timeout: float = 20.0) -> tuple[int, str]:
        """Send ``signum`` and wait: the exit code and stderr."""
        if self.process.poll() is None:
            self.process.send_signal(signum)
        return self.wait(timeout), self.stderr

    def wait(self, timeout: float) -> int:
        """The exit code, once the stack and its output have ended (killed after ``timeout``)."""
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise
        for pump in self._pumps:  # a child holding our pipes must not hang the test
            pump.join(5)
        return code

    @property
    def stderr(self) -> str:
        return "".join(self.errors)

    def request(
        self,
        method: str,
        path: str,
        *,
        key: str | None = None,
        body: Any = None,
        raw: bytes | None = None,
        headers: dict[str, str] | None = None,
        content_type: str | None = "application/json",
    ) -> tuple[int, Any, dict[str, str]]:
        """One HTTP call to the API, with exactly these headers (``content_type`` None sends
        no Content-Type): status, the body parsed as JSON (None if empty, the text if it is not
        JSON), headers with lower-case names."""
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        hdrs = {"Content-Type": content_type} if content_type else {}
        hdrs |= headers or {}
        if key:
            hdrs["x-api-key"] = key
        url = urlsplit(self.api + path)
        conn = http.client.HTTPConnection(url.hostname or "", url.port, timeout=30)
        try:
            conn.request(method, url.path + (f"?{url.query}" if url.query else ""), data, hdrs)
            resp = conn.getresponse()
            status, text = resp.status, resp.read()
            got = {name.lower(): value for name, value in resp.getheaders()}
        finally:
            conn.close()
        try:
            parsed = json.loads(text) if text else None
        except ValueError:
            parsed = text.decode(errors="replace")
        return status, parsed, got


def start_stack(state_dir: Path, **env: str) -> RunningStack:
    """Start the stack and return at once (``wait_ready`` waits for the ready lines)."""
    full_env = stack_env(state_dir, **env)
    process = subprocess.Popen(
        [sys.executable, "-m", "ops.local"],
        cwd=ROOT,
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    stack = RunningStack(process, full_env)

    def pump() -> None:  # read stdout continuously so the stack never blocks on a full pipe
        assert process.stdout is not None
        for line in process.stdout:
            stack.lines.append(line.rstrip("\n"))
            stack._stdout.put(line.rstrip("\n"))
        stack._stdout.put(None)

    def pump_stderr() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            stack.errors.append(line)

    stack._pumps = [
        threading.Thread(target=pump, daemon=True),
        threading.Thread(target=pump_stderr, daemon=True),
    ]
    for thread in stack._pumps:
        thread.start()
    return stack


def admin(stack: RunningStack, *args: str) -> dict[str, Any]:
    """``python -m ops.admin ...`` against the stack, as ``make tenant`` runs it."""
    env = {k: v for k, v in stack.env.items() if k != "AWS_PORT"}  # found via the state file
    out = subprocess.run(
        [sys.executable, "-m", "ops.admin", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result

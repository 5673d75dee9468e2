"""Every ``ops.admin`` command (``make tenant`` and docs/tenants.md's admin commands) against a
running local stack, run as a user runs it: from the shell that started the stack - its ports
and settings (``AWS_PORT``, ``DYNAMODB``, ``DYNAMODB_PORT``, ``LOCAL_STATE_DIR``) exported - and
with that shell's settings for a real AWS account (another region, a profile, credentials),
which the local stack must not follow. Shared by the default stack's tests and the real parts'.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

from ops.template import ROOT
from tests.support.local_stack import RunningStack

REVOKED_TIMEOUT_S = 10.0  # the contract's 1 s is asserted by test_sdk_and_cli.py

REAL_ACCOUNT_SHELL = {
    "AWS_DEFAULT_REGION": "eu-west-1",  # moto keeps each region's tables and queues apart
    "AWS_REGION": "eu-west-1",
    "AWS_PROFILE": "someone-elses-profile",  # a profile that does not exist here
    "AWS_ACCESS_KEY_ID": "AKIAIOSFODNN7EXAMPLE",
    "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    "AWS_SESSION_TOKEN": "a-real-session",
}


def user_shell(stack: RunningStack, **extra: str) -> dict[str, str]:
    """The environment of the terminal that ran ``make run`` for ``stack``."""
    return {**stack.env, **REAL_ACCOUNT_SHELL, **extra}


def run_admin(
    stack: RunningStack, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ops.admin", *args],
        cwd=ROOT,
        env=user_shell(stack) if env is None else env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def admin_ok(stack: RunningStack, *args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    done = run_admin(stack, *args, env=env)
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def admin_fails(stack: RunningStack, *args: str, env: dict[str, str] | None = None) -> str:
    """The one line a failing command prints on stderr (exit 1, nothing on stdout)."""
    done = run_admin(stack, *args, env=env)
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert done.stdout == "", done.stdout
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    return lines[0]


def make_tenant(stack: RunningStack, name: str) -> dict[str, Any]:
    """``make tenant NAME=name``, as docs/tenants.md says (its last stdout line is the answer)."""
    done = subprocess.run(
        ["make", "-s", "tenant", f"NAME={name}"],
        cwd=ROOT,
        env=user_shell(stack),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def check_every_admin_command(stack: RunningStack, name: str) -> None:
    """Create, show, add and revoke a key, allow and disallow a queue, spread, rate, rotate the
    webhook secret - each seen working through the API - and an unknown tenant, in one line."""
    made = make_tenant(stack, name)
    assert made["tenant"] == name and made["api_key"].startswith("tk_")
    status, me, _ = stack.request("GET", "/tenant", key=made["api_key"])
    assert (status, me["tenant"], me["callback_queue_url"]) == (
        200, name, made["callback_queue_url"],
    )  # fmt: skip
    assert made["callback_queue_url"].startswith(stack.aws_endpoint)

    second = admin_ok(stack, "key", "add", name)["api_key"]
    assert stack.request("GET", "/tenant", key=second)[0] == 200
    assert admin_ok(stack, "key", "revoke", made["api_key"]) == {"revoked": True}
    deadline = time.monotonic() + REVOKED_TIMEOUT_S
    while stack.request("GET", "/tenant", key=made["api_key"])[0] != 401:
        assert time.monotonic() < deadline, "a revoked key still works"
        time.sleep(0.1)

    # The API remembers a key's tenant for 30 s: a key it has not seen reads the tenant anew.
    extra = f"{stack.aws_endpoint}/123456789012/{name}-orders"
    allowed = admin_ok(stack, "queue", "allow", name, extra)
    assert allowed == {"tenant": name, "allowed_queue_urls": [extra]}
    key = admin_ok(stack, "key", "add", name)["api_key"]
    timer = {"schedule": {"type": "at", "at": "2099-01-01T00:00:00Z"},
             "target": {"queue_url": extra}}  # fmt: skip
    status, created, _ = stack.request("POST", "/timers", key=key, body=timer)
    assert status == 201, created
    assert stack.request("DELETE", f"/timers/{created['id']}", key=key)[0] == 204
    shown = admin_ok(stack, "tenant", "show", name)
    assert (shown["tenant"], shown["allowed_queue_urls"]) == (name, [extra])
    assert admin_ok(stack, "queue", "disallow", name, extra)["allowed_queue_urls"] == []
    key = admin_ok(stack, "key", "add", name)["api_key"]
    assert stack.request("POST", "/timers", key=key, body=timer)[0] == 400

    assert admin_ok(stack, "tenant", "spread", name, "4") == {"tenant": name, "spread": 4}
    assert admin_ok(stack, "tenant", "rate", name, "100") == {
        "tenant": name, "rate_limit_per_s": 100,
    }  # fmt: skip
    rotated = admin_ok(stack, "webhook", "rotate", name, "--window-hours", "0")
    assert rotated["webhook_secret"] != made["webhook_secret"]
    assert admin_ok(stack, "tenant", "show", name)["webhook_secret"] == rotated["webhook_secret"]

    assert admin_fails(stack, "key", "add", "ghost") == "ops.admin: no tenant 'ghost'"
    assert admin_fails(stack, "tenant", "show", "ghost") == "ops.admin: no tenant 'ghost'"
    assert admin_fails(stack, "tenant", "create", "Not_A_Name").startswith(
        "ops.admin: invalid tenant name (name: "
    )

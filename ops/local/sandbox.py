"""Inside a local Lambda sandbox: import the handler (the cold start), then serve invocations.

This module runs in the sandbox process and imports nothing of the stack's (the standard
library and the context object only), so a sandbox starts as a Lambda sandbox does: a fresh
process whose init is the handler's own imports. Workers are forked from a small server that
has imported only this module (:mod:`ops.local.lambdas`): no interpreter start and no import of
the stack per cold start, which on two busy cores used to add seconds that Lambda does not.
"""

from __future__ import annotations

import json
import math
import os
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from importlib import import_module
from multiprocessing.connection import Connection
from typing import Any

from ops.local.context import LambdaContext


@dataclass(frozen=True)
class SandboxSpec:
    """What a sandbox needs of its function (plain data: it crosses into the process)."""

    name: str
    module: str
    attr: str
    code_paths: tuple[str, ...]
    timeout_s: float
    memory_mb: int


def error_of(exc: BaseException) -> tuple[str, str, list[str]]:
    trace = traceback.format_exception(exc)
    return type(exc).__name__, str(exc), [line.rstrip() for line in trace]


def report_line(
    request_id: str,
    wall_s: float,
    cpu_s: float,
    memory_mb: int,
    init_ms: float | None,
    init_cpu_ms: float | None = None,
) -> str:
    """Lambda's REPORT line for one invocation (billed per ms), with the sandbox process's CPU
    time beside it (a local extra: what the handler computed; the rest of its time it waited),
    and after a cold start's Init Duration the CPU its import took (a local extra too)."""
    duration = wall_s * 1000
    line = (
        f"REPORT RequestId: {request_id}\tDuration: {duration:.2f} ms\t"
        f"Billed Duration: {math.ceil(duration)} ms\tMemory Size: {memory_mb} MB\t"
        f"CPU: {cpu_s * 1000:.2f} ms"
    )
    if init_ms is None:
        return line
    line = f"{line}\tInit Duration: {init_ms:.2f} ms"
    return line if init_cpu_ms is None else f"{line}\tInit CPU: {init_cpu_ms:.2f} ms"


def serve(spec: SandboxSpec, env: dict[str, str], conn: Connection, log: str) -> None:
    """A worker process: import the handler, then serve invocations until the pipe closes."""
    parent = os.getppid()  # the fork server, which ends with the stack
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the stack owns Ctrl-C and stops us itself
    out = open(log, "a", buffering=1)  # noqa: SIM115 - lives as long as the process
    os.dup2(out.fileno(), 1)
    os.dup2(out.fileno(), 2)
    # Every sandbox of a function appends to one file: a line must reach it in one write. An
    # unbuffered stdout writes print()'s text and its newline apart, and another sandbox's
    # line could land between them; a line-buffered one writes the whole line at its newline.
    sys.stdout = sys.stderr = out

    def orphaned() -> None:  # the stack was killed outright (and its fork server): go too
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=orphaned, daemon=True).start()
    os.environ.clear()
    os.environ.update(env)
    time.tzset()  # TZ=UTC, as in Lambda
    sys.path[:0] = spec.code_paths
    init_started, init_cpu = time.monotonic(), time.process_time()
    try:
        handler = getattr(import_module(spec.module), spec.attr)
    except BaseException as exc:
        conn.send(("init_error", error_of(exc)))
        return
    init_ms: float | None = (time.monotonic() - init_started) * 1000
    init_cpu_ms: float | None = (time.process_time() - init_cpu) * 1000
    conn.send(("ready", None))
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        request_id, event = message
        context = LambdaContext(
            function_name=spec.name,
            memory_limit_in_mb=spec.memory_mb,
            timeout_s=spec.timeout_s,
            aws_request_id=request_id,
            log_group_name=f"/aws/lambda/{spec.name}",
        )
        wall, cpu = time.monotonic(), time.process_time()
        try:
            reply: tuple[str, Any] = ("ok", json.dumps(handler(event, context)).encode())
        except Exception as exc:
            traceback.print_exc()
            reply = ("error", error_of(exc))
        wall, cpu = time.monotonic() - wall, time.process_time() - cpu
        print(report_line(request_id, wall, cpu, spec.memory_mb, init_ms, init_cpu_ms), flush=True)
        init_ms = init_cpu_ms = None
        conn.send(reply)

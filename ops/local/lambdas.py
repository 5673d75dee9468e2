"""Functions run the way Lambda runs them: one process per sandbox, reused while warm.

Each function has a pool of worker processes. A worker sets the function's environment (and
nothing else of the caller's), imports the handler once (the cold start), then handles one
event at a time with a fresh context object. An invocation that runs past the template's
Timeout kills its worker, as Lambda ends a timed-out sandbox; the next one starts cold.
Async invocations queue, age out after MaximumEventAgeInSeconds and retry per
MaximumRetryAttempts, like Lambda's event queue. A sandbox left idle longer than the pool's
idle time is stopped, as Lambda retires idle sandboxes, so the next invocation starts cold.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ops.local.sandbox import SandboxSpec, serve
from ops.local.spec import FunctionSpec

IDLE_S = 300.0
"""How long an idle sandbox lives (``LOCAL_LAMBDA_IDLE_S``): Lambda does not document it;
idle sandboxes are seen retired after roughly 5 to 15 minutes, sooner under memory pressure."""
INIT_TIMEOUT_S = 60.0  # generous: a cold import on a busy 2-core laptop is slow
ASYNC_RETRY_DELAYS_S = (60.0, 120.0)  # Lambda retries a failed async event after ~1, then ~2 min
# Sandboxes are forked from a server that imported only ops.local.sandbox (never from the
# stack, which runs threads): a cold start is the handler's imports, as in Lambda.
_SANDBOXES = multiprocessing.get_context("forkserver")
_SANDBOXES.set_forkserver_preload(["ops.local.sandbox"])
_BASE_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "SYSTEMROOT", "VIRTUAL_ENV")


@dataclass(frozen=True)
class Outcome:
    """What Invoke returns: the payload, and the error type when the function failed."""

    payload: bytes
    function_error: str | None = None  # "Unhandled", as in X-Amz-Function-Error

    @classmethod
    def failed(cls, error_type: str, message: str, trace: list[str] | None = None) -> Outcome:
        body = {"errorMessage": message, "errorType": error_type, "stackTrace": trace or []}
        return cls(json.dumps(body).encode(), "Unhandled")

    def error(self) -> dict[str, Any]:
        """The error body of a failed invocation."""
        body: dict[str, Any] = json.loads(self.payload)
        return body


def sandbox_env(spec: FunctionSpec, region: str, runtime: dict[str, str]) -> dict[str, str]:
    """The environment a sandbox sees: what Lambda sets, ``runtime`` (where AWS is, the
    credentials), then the function's own variables - and nothing else of the caller's."""
    env = {k: os.environ[k] for k in _BASE_ENV if k in os.environ}
    env.update(
        AWS_REGION=region,
        AWS_DEFAULT_REGION=region,
        AWS_LAMBDA_FUNCTION_NAME=spec.name,
        AWS_LAMBDA_FUNCTION_MEMORY_SIZE=str(spec.memory_mb),
        AWS_LAMBDA_FUNCTION_VERSION="$LATEST",
        AWS_LAMBDA_LOG_GROUP_NAME=f"/aws/lambda/{spec.name}",
        AWS_EXECUTION_ENV="AWS_Lambda_python3.12",
        LAMBDA_TASK_ROOT=spec.code_paths[0],
        TZ="UTC",
        PYTHONUNBUFFERED="1",
    )
    env.update(runtime)
    env.update(spec.environment)
    return env


class Worker:
    """One sandbox process and the pipe to it."""

    def __init__(self, spec: FunctionSpec, env: dict[str, str], log: Path) -> None:
        self.spec = spec
        self.conn, child = _SANDBOXES.Pipe()
        plain = SandboxSpec(
            spec.name, spec.module, spec.attr, spec.code_paths, spec.timeout_s, spec.memory_mb
        )
        self.process = _SANDBOXES.Process(
            target=serve,
            args=(plain, env, child, str(log)),
            name=f"lambda:{spec.name}",
            daemon=True,
        )
        self.process.start()
        child.close()

    def wait_ready(self) -> Outcome | None:
        """None once the handler imported, else the init error (and the worker is dead)."""
        if not self.conn.poll(INIT_TIMEOUT_S):
            self.kill()
            return Outcome.failed("Sandbox.Timedout", f"init took over {INIT_TIMEOUT_S:.0f}s")
        try:
            kind, detail = self.conn.recv()
        except EOFError:
            self.kill()
            return Outcome.failed("Runtime.ExitError", "the runtime exited during init")
        if kind == "ready":
            return None
        self.kill()
        name, message, trace = detail
        return Outcome.failed("Runtime.ImportModuleError", f"{name}: {message}", trace)

    def run(self, request_id: str, event: Any) -> tuple[Outcome, bool]:
        """The outcome, and whether the worker can be reused."""
        try:
            self.conn.send((request_id, event))
            if not self.conn.poll(self.spec.timeout_s):
                self.kill()
                message = f"Task timed out after {self.spec.timeout_s:.2f} seconds"
                return Outcome.failed("Sandbox.Timedout", message), False
            kind, detail = self.conn.recv()
        except (EOFError, OSError, BrokenPipeError):
            self.kill()
            return Outcome.failed("Runtime.ExitError", "the runtime exited"), False
        if kind == "ok":
            return Outcome(detail), True
        name, message, trace = detail
        return Outcome.failed(name, message, trace), True

    def stop(self) -> None:
        with contextlib.suppress(OSError, BrokenPipeError):
            self.conn.send(None)
        self.process.join(0.5)
        self.kill()

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(5)
        self.conn.close()


class FunctionPool:
    """The sandboxes of one function: at most ``concurrency`` run at once."""

    def __init__(
        self,
        spec: FunctionSpec,
        env: dict[str, str],
        log_dir: Path,
        concurrency: int,
        report: Callable[[str], None],
        idle_s: float = IDLE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not idle_s > 0:
            raise ValueError(f"idle_s must be a positive number of seconds, got {idle_s!r}")
        self.spec = spec
        self._env = env
        self._log = log_dir / f"{spec.name}.log"
        self._report = report
        self._idle_s = idle_s
        self._clock = clock
        self._slots = threading.BoundedSemaphore(concurrency)
        self._idle: list[tuple[Worker, float]] = []  # (sandbox, idle since); warmest last
        self._events = ThreadPoolExecutor(concurrency, thread_name_prefix=f"{spec.name}-event")
        self._lock = threading.Lock()
        self._workers: set[Worker] = set()
        self._starting = 0  # sandboxes importing their handler (a cold start)
        self._closed = False

    def sandboxes(self) -> int:
        """Sandboxes ready (busy or idle), not counting those still starting."""
        with self._lock:
            return len(self._workers) - self._starting

    def warm(self) -> Outcome | None:
        """Start one sandbox now; None if the handler imports, else its init error."""
        worker, failure = self._start()
        if worker is not None:
            self._park(worker)
        return failure

    def _park(self, worker: Worker) -> None:
        with self._lock:
            self._idle.append((worker, self._clock()))

    def retire_idle(self) -> int:
        """Stop the sandboxes idle for ``idle_s`` or longer (how many). The stack calls this
        often; taking a sandbox calls it too, so a retired one is never handed out late."""
        now = self._clock()
        with self._lock:
            stale = [w for w, since in self._idle if now - since >= self._idle_s]
            self._idle = [(w, since) for w, since in self._idle if now - since < self._idle_s]
            self._workers.difference_update(stale)
        for worker in stale:
            worker.stop()
        return len(stale)

    def _start(self) -> tuple[Worker | None, Outcome | None]:
        worker = Worker(self.spec, self._env, self._log)
        with self._lock:
            self._workers.add(worker)
            self._starting += 1
        try:
            failure = worker.wait_ready()
        finally:
            with self._lock:
                self._starting -= 1
        if failure is not None:
            self._forget(worker)
            return None, failure
        return worker, None

    def _forget(self, worker: Worker) -> None:
        with self._lock:
            self._workers.discard(worker)

    def invoke(self, event: Any) -> Outcome:
        """Run one event synchronously (RequestResponse), waiting for a free slot."""
        request_id = str(uuid.uuid4())
        with self._slots:
            worker = self._warm_worker()
            if worker is None:
                worker, failure = self._start()  # cold start
                if worker is None:
                    assert failure is not None
                    return self._reported(request_id, failure)
            outcome, reusable = worker.run(request_id, event)
            if reusable and not self._closed:
                self._park(worker)
            else:
                worker.kill()
                self._forget(worker)
        return self._reported(request_id, outcome)

    def _warm_worker(self) -> Worker | None:
        self.retire_idle()
        with self._lock:
            return self._idle.pop()[0] if self._idle else None

    def _reported(self, request_id: str, outcome: Outcome) -> Outcome:
        if outcome.function_error and not self._closed:  # not the sandboxes close() killed
            error = outcome.error()
            self._report(
                f"{self.spec.name} {request_id[:8]}: {error['errorType']}: {error['errorMessage']}"
            )
        return outcome

    def invoke_async(self, event: Any, attempt: int = 0) -> None:
        """Queue an event (InvocationType=Event); returns at once."""
        if self._closed:
            return
        queued = time.monotonic()
        self._events.submit(self._deliver, event, queued, attempt)

    def _deliver(self, event: Any, queued: float, attempt: int) -> None:
        if self._closed:
            return
        if time.monotonic() - queued > self.spec.max_event_age_s:
            self._report(f"{self.spec.name}: dropped an event older than its maximum age")
            return
        outcome = self.invoke(event)
        if outcome.function_error and attempt < self.spec.async_retries:
            delay = ASYNC_RETRY_DELAYS_S[min(attempt, len(ASYNC_RETRY_DELAYS_S) - 1)]
            retry = threading.Timer(delay, self.invoke_async, (event, attempt + 1))
            retry.daemon = True
            retry.start()

    def close(self) -> None:
        """Stop every sandbox, busy or idle, and drop queued events."""
        self._closed = True
        self._events.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            workers = list(self._workers)
            self._workers.clear()
            self._idle.clear()
        for worker in workers:
            worker.kill()

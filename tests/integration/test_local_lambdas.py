"""The local stack's sandboxes behave as Lambda's: warm reuse, a fresh context per event, the
function's environment only, timeouts and crashes that end the sandbox, init errors, and an
async queue that retries as configured."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from ops.local import lambdas
from ops.local.lambdas import FunctionPool, sandbox_env
from ops.local.spec import FunctionSpec

SANDBOX = str(Path(__file__).resolve().parent.parent / "support" / "sandbox")


def spec(module: str = "handlers", **overrides: Any) -> FunctionSpec:
    values: dict[str, Any] = {
        "name": "Probe",
        "module": module,
        "attr": "handler",
        "code_paths": (SANDBOX,),
        "environment": {"GREETING": "hello"},
        "timeout_s": 2.0,
        "memory_mb": 128,
        "async_retries": 0,
        "max_event_age_s": 60,
    }
    return FunctionSpec(**{**values, **overrides})


def make_pool(
    function: FunctionSpec, log_dir: Path, reports: list[str], concurrency: int = 2
) -> FunctionPool:
    env = sandbox_env(function, "us-east-1", {"AWS_ENDPOINT_URL": "http://127.0.0.1:1"})
    return FunctionPool(function, env, log_dir, concurrency, report=reports.append)


@pytest.fixture
def reports() -> list[str]:
    return []


@pytest.fixture
def pool(
    tmp_path: Path, reports: list[str], monkeypatch: pytest.MonkeyPatch
) -> Iterator[FunctionPool]:
    monkeypatch.setenv("LEAK", "the caller's secret")
    p = make_pool(spec(), tmp_path, reports)
    yield p
    p.close()


def result(outcome: lambdas.Outcome) -> Any:
    assert outcome.function_error is None, outcome.payload
    return json.loads(outcome.payload)


def test_a_warm_sandbox_is_reused_with_a_fresh_context_each_time(pool: FunctionPool) -> None:
    first, second = result(pool.invoke({"n": 1})), result(pool.invoke({"n": 2}))
    assert (first["event"], second["event"]) == ({"n": 1}, {"n": 2})
    assert first["pid"] == second["pid"]
    assert first["request_id"] != second["request_id"]
    assert first["function"] == "Probe"
    assert 0 < first["remaining_ms"] <= 2000


def test_the_sandbox_sees_the_function_environment_not_the_callers(pool: FunctionPool) -> None:
    env = result(pool.invoke({}))["env"]
    assert env == {"GREETING": "hello", "AWS_LAMBDA_FUNCTION_NAME": "Probe", "LEAK": None}


def test_a_function_error_is_returned_and_the_sandbox_kept(
    pool: FunctionPool, reports: list[str]
) -> None:
    pid = result(pool.invoke({}))["pid"]
    outcome = pool.invoke({"do": "fail"})
    assert outcome.function_error == "Unhandled"
    assert outcome.error()["errorType"] == "ValueError"
    assert "bad event" in outcome.error()["errorMessage"]
    assert result(pool.invoke({}))["pid"] == pid
    assert len(reports) == 1 and "ValueError" in reports[0]


@pytest.mark.parametrize(
    ("do", "error_type"), [("hang", "Sandbox.Timedout"), ("exit", "Runtime.ExitError")]
)
def test_a_timeout_or_a_crash_ends_the_sandbox_and_the_next_starts_cold(
    tmp_path: Path, reports: list[str], do: str, error_type: str
) -> None:
    pool = make_pool(spec(timeout_s=0.5), tmp_path, reports)
    try:
        pid = result(pool.invoke({}))["pid"]
        outcome = pool.invoke({"do": do})
        assert outcome.error()["errorType"] == error_type
        assert result(pool.invoke({}))["pid"] != pid
    finally:
        pool.close()


def test_a_result_that_is_not_json_is_a_function_error(pool: FunctionPool) -> None:
    assert pool.invoke({"do": "not_json"}).error()["errorType"] == "TypeError"


def test_an_import_error_is_reported_at_warm_up(tmp_path: Path, reports: list[str]) -> None:
    pool = make_pool(spec(module="broken"), tmp_path, reports)
    try:
        failure = pool.warm()
        assert failure is not None
        assert failure.error()["errorType"] == "Runtime.ImportModuleError"
        assert "module_that_does_not_exist" in failure.error()["errorMessage"]
    finally:
        pool.close()


def eventually(condition: Callable[[], bool], within_s: float = 60.0) -> bool:
    """Poll ``condition``: async events run on the pool's threads and sandboxes, on the wall
    clock (a cold start on a loaded runner takes seconds), so there is no clock to pass."""
    deadline = time.monotonic() + within_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_async_events_are_retried_as_configured(
    tmp_path: Path, reports: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lambdas, "ASYNC_RETRY_DELAYS_S", (0.0,))
    pool = make_pool(spec(async_retries=1), tmp_path, reports)
    out = tmp_path / "delivered"
    try:
        pool.invoke_async({"do": "fail_once", "path": str(out), "value": 42})
        assert eventually(out.exists)
        assert out.read_text() == "42"
        assert len(reports) == 1 and "first attempt fails" in reports[0]
    finally:
        pool.close()


def test_without_retries_a_failed_async_event_is_dropped(
    tmp_path: Path, reports: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lambdas, "ASYNC_RETRY_DELAYS_S", (0.0,))
    pool = make_pool(spec(async_retries=0), tmp_path, reports, concurrency=1)
    out = tmp_path / "delivered"
    try:
        pool.invoke_async({"do": "fail_once", "path": str(out), "value": 1})
        assert eventually(lambda: len(reports) == 1)
        # A retry would be queued at once (no delay), ahead of this second event on the
        # one-sandbox queue: once the second has run, a retry would have run too.
        pool.invoke_async({"do": "fail_once", "path": str(tmp_path / "second"), "value": 2})
        assert eventually(lambda: len(reports) == 2)
        assert not out.exists()
    finally:
        pool.close()


# ---------------------------------------------------------------- idle sandboxes retire


class Clock:
    """The pool's idle clock, moved by hand: idle time passes without waiting for it."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def idle_pool(tmp_path: Path, reports: list[str]) -> Iterator[tuple[FunctionPool, Clock]]:
    """A pool whose sandboxes retire after 30 s idle, on a clock the test moves."""
    clock = Clock()
    function = spec()
    env = sandbox_env(function, "us-east-1", {})
    pool = FunctionPool(function, env, tmp_path, 2, reports.append, idle_s=30, clock=clock)
    try:
        yield pool, clock
    finally:
        pool.close()


def test_an_idle_sandbox_is_retired_and_the_next_invocation_starts_cold(
    idle_pool: tuple[FunctionPool, Clock], reports: list[str]
) -> None:
    pool, clock = idle_pool
    first = result(pool.invoke({}))["pid"]
    clock.now += 29.9  # idle, but not for long enough
    assert pool.retire_idle() == 0
    assert result(pool.invoke({}))["pid"] == first  # warm; its idle time starts again

    clock.now += 30
    assert pool.retire_idle() == 1
    assert pool.sandboxes() == 0
    assert result(pool.invoke({}))["pid"] != first  # cold
    assert reports == []


def test_a_sandbox_past_its_idle_time_is_not_handed_out_even_before_the_reaper_runs(
    idle_pool: tuple[FunctionPool, Clock],
) -> None:
    pool, clock = idle_pool
    assert pool.warm() is None  # as the stack warms each function at start
    first = result(pool.invoke({}))["pid"]
    clock.now += 30
    assert result(pool.invoke({}))["pid"] != first
    assert pool.sandboxes() == 1  # the retired one is gone, not leaked


def test_only_the_sandboxes_idle_long_enough_retire(tmp_path: Path, reports: list[str]) -> None:
    clock = Clock()
    function = spec()
    env = sandbox_env(function, "us-east-1", {})
    pool = FunctionPool(function, env, tmp_path, 2, reports.append, idle_s=30, clock=clock)
    try:
        assert pool.warm() is None
        clock.now += 20
        assert pool.warm() is None
        assert pool.sandboxes() == 2
        clock.now += 10  # the first has idled 30 s, the second 10 s
        assert pool.retire_idle() == 1
        assert pool.sandboxes() == 1
    finally:
        pool.close()


@pytest.mark.parametrize("idle_s", [0, -1.0])
def test_the_idle_time_must_be_positive(tmp_path: Path, idle_s: float) -> None:
    function = spec()
    with pytest.raises(ValueError, match="idle_s must be a positive"):
        FunctionPool(function, sandbox_env(function, "us-east-1", {}), tmp_path, 1, print, idle_s)


def test_each_invocation_logs_a_report_line_as_lambda_does(
    pool: FunctionPool, tmp_path: Path
) -> None:
    """Lambda's REPORT line (duration, billed ms, memory; the init on a sandbox's first), with
    the sandbox process's CPU time beside it: what bench.cost reads durations from."""
    first, second = result(pool.invoke({})), result(pool.invoke({}))
    lines = [line for line in (tmp_path / "Probe.log").read_text().splitlines()
             if line.startswith("REPORT ")]  # fmt: skip
    assert len(lines) == 2
    for line, reply in zip(lines, (first, second), strict=True):
        fields = dict(part.split(": ", 1) for part in line.removeprefix("REPORT ").split("\t"))
        assert fields["RequestId"] == reply["request_id"]
        duration = float(fields["Duration"].removesuffix(" ms"))
        assert int(fields["Billed Duration"].removesuffix(" ms")) == math.ceil(duration)
        assert fields["Memory Size"] == "128 MB"
        assert float(fields["CPU"].removesuffix(" ms")) >= 0
    assert "Init Duration" in lines[0] and "Init Duration" not in lines[1]
    assert "Init CPU" in lines[0] and "Init CPU" not in lines[1]  # the import's CPU (local)


def test_the_lines_of_sandboxes_running_at_once_reach_their_log_whole(
    pool: FunctionPool, tmp_path: Path
) -> None:
    """All sandboxes of a function append to one log file; a line printed in two writes (an
    unbuffered stdout writes the text, then the newline) could take another sandbox's line
    in between - and bench.e2e reads the trigger's runs from those lines."""
    with ThreadPoolExecutor(2) as both:
        pids = {
            result(r)["pid"] for r in both.map(pool.invoke, [{"do": "print", "lines": 3000}] * 2)
        }
    assert len(pids) == 2  # two sandboxes wrote at once
    printed = [json.loads(line) for line in (tmp_path / "Probe.log").read_text().splitlines()
               if not line.startswith("REPORT ")]  # fmt: skip
    assert sorted((p["pid"], p["n"]) for p in printed) == sorted(
        (pid, n) for pid in pids for n in range(3000)
    )

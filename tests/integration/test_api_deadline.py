"""A slow or cold api answers the contract's 503 ``unavailable`` with ``Retry-After``, never
API Gateway's 500 (functions/api/app/deadline.py): a request still running at its deadline is
interrupted and answered, one that reaches the function after it is answered at once, and the
function's own timeout bounds the deadline too. Before, the request ran on until Lambda killed
the function (its Timeout), which the HTTP API answers ``500 {"message": "Internal Server
Error"}``."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from functions.api import app as api_app
from functions.api.app import deadline
from ops.local.apigw import from_proxy_result
from ops.local.context import LambdaContext
from tests.integration.api_harness import Api, make_api
from tests.support import apigw
from tests.support.clock import FakeClock

AT = "2030-01-01T00:00:00Z"
BODY = {"schedule": {"type": "at", "at": AT}, "payload": {"a": 1}}


@pytest.fixture
def api(
    aws: None, clock: FakeClock, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Api]:
    yield make_api(monkeypatch, clock, redis_url)


def create_event(api: Api, arrived_ms_ago: int = 0) -> dict[str, Any]:
    event = apigw.event("POST", "/v1/timers", body=BODY, headers={"x-api-key": api.keys["acme"]})
    event["requestContext"]["timeEpoch"] = time.time_ns() // 1_000_000 - arrived_ms_ago
    return event


def answer(event: dict[str, Any], timeout_s: float = 30.0) -> tuple[int, Any, dict[str, str]]:
    """The handler's answer as API Gateway reads it (None: it would answer 500 itself)."""
    result = api_app.handler(event, LambdaContext(function_name="api", timeout_s=timeout_s))
    response = from_proxy_result(json.dumps(result).encode())
    assert response is not None, f"API Gateway would answer 500 to {result}"
    headers = {name.lower(): value for name, value in response.headers}
    return response.status, json.loads(response.body), headers


def is_unavailable(status: int, body: Any, headers: dict[str, str]) -> None:
    assert status == 503, body
    assert body["error"]["code"] == "unavailable" and body["error"]["details"] == []
    assert "retry" in body["error"]["message"]
    assert headers["retry-after"] == "1"


def slow_create(api: Api, monkeypatch: pytest.MonkeyPatch, seconds: float) -> list[float]:
    calls: list[float] = []
    real = api.runtime.service.create

    def slow(*args: Any, **kwargs: Any) -> Any:
        calls.append(time.monotonic())
        time.sleep(seconds)
        return real(*args, **kwargs)

    monkeypatch.setattr(api.runtime.service, "create", slow)
    return calls


def test_a_request_still_running_at_its_deadline_is_a_503_with_retry_after(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = slow_create(api, monkeypatch, 60.0)
    # Arrived at the gateway 20 s ago (a cold start, a wait for a sandbox): 5 s are left.
    started = time.monotonic()
    is_unavailable(*answer(create_event(api, deadline.ANSWER_WITHIN_MS - 5_000)))
    assert calls and time.monotonic() - started < 20.0  # cut at its deadline, not after 60 s


def test_a_request_that_arrives_after_its_deadline_is_answered_at_once(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = slow_create(api, monkeypatch, 0.0)
    is_unavailable(*answer(create_event(api, deadline.ANSWER_WITHIN_MS + 50)))
    assert calls == []  # nothing was done


def test_the_functions_own_timeout_bounds_the_deadline(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A function Timeout of 6 s leaves 5 s before its margin: answered by then."""
    calls = slow_create(api, monkeypatch, 60.0)
    started = time.monotonic()
    is_unavailable(*answer(create_event(api), timeout_s=deadline.TIMEOUT_MARGIN_MS / 1000 + 5))
    assert calls and time.monotonic() - started < 20.0


def test_a_request_in_time_is_answered_as_ever_and_leaves_no_alarm(api: Api) -> None:
    import signal

    status, body, _ = answer(create_event(api, 1_000))
    assert status == 201 and body["id"]
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    assert signal.getsignal(signal.SIGALRM) in (signal.SIG_DFL, signal.SIG_IGN, None)


def test_a_replayed_event_is_bounded_by_the_timeout_only(api: Api) -> None:
    """An event older than the integration timeout is no live request (API Gateway gave up on
    it): a sample or replayed one, answered as ever (the sample events of events/)."""
    status, body, _ = answer(create_event(api, deadline.INTEGRATION_TIMEOUT_MS + 60_000))
    assert status == 201 and body["id"]

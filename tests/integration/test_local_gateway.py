"""The local stack's HTTP gateway over real HTTP, with recording stand-ins for the functions: it
serves every method, builds payload format 2.0 events, maps results back as an HTTP API does,
answers with the HTTP API's own bodies, and keeps the Lambda Invoke API on the same port."""

from __future__ import annotations

import base64
import http.client
import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from ops.local.gateway import Gateway
from ops.local.lambdas import Outcome
from ops.local.spec import Route, StackSpec
from ops.ports import free_port

Result = Callable[[dict[str, Any]], Outcome]


class RecordingPool:
    """Stands in for a function's sandbox pool: keeps each event, answers with ``result``."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.result: Result = answer()

    def invoke(self, event: dict[str, Any]) -> Outcome:
        self.events.append(event)
        return self.result(event)

    def invoke_async(self, event: dict[str, Any]) -> None:
        self.events.append(event)


def answer(status: int = 200, **fields: Any) -> Result:
    return lambda event: Outcome(json.dumps({"statusCode": status, **fields}).encode())


class Served:
    def __init__(self, routes: list[Route]) -> None:
        self.pools = {route.function: RecordingPool() for route in routes}
        stack = StackSpec("timers", "us-east-1", {}, routes, [])
        self.gateway = Gateway(free_port(), stack, self.pools, lambda line: None)  # type: ignore[arg-type]
        self.thread = self.gateway.serve_in_background()

    def reset(self) -> Served:
        for pool in self.pools.values():
            pool.events.clear()
            pool.result = answer()
        return self

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: list[tuple[str, str]] | None = None,
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.gateway.server_address[1], timeout=10)
        try:
            conn.putrequest(method, path, skip_accept_encoding=True)
            for name, value in headers or []:
                conn.putheader(name, value)  # repeats stay repeats on the wire
            if body is not None:
                conn.putheader("Content-Length", str(len(body)))
            conn.endheaders(body)
            response = conn.getresponse()
            return response.status, response.getheaders(), response.read()
        finally:
            conn.close()

    def stop(self) -> None:
        self.gateway.shutdown()
        self.gateway.server_close()
        self.thread.join(5)


ITEM = Route("GET", "/items/{id}", "Items", "$default")
CREATE = Route("POST", "/items", "Items", "$default")
CATCH_ALL = Route("ANY", "$default", "CatchAll", "$default")


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[Served, Served]]:
    """Two gateways for the module: without a $default route, and with one."""
    pair = (Served([ITEM, CREATE]), Served([ITEM, CATCH_ALL]))
    try:
        yield pair
    finally:
        for server in pair:
            server.stop()


@pytest.fixture
def plain(servers: tuple[Served, Served]) -> Served:
    return servers[0].reset()


@pytest.fixture
def catch_all(servers: tuple[Served, Served]) -> Served:
    return servers[1].reset()


def header(headers: list[tuple[str, str]], name: str) -> list[str]:
    return [v for k, v in headers if k.lower() == name.lower()]


@pytest.mark.parametrize("method", ["TRACE", "CONNECT", "BREW", "PROPFIND", "GET", "OPTIONS"])
def test_without_a_catch_all_an_unrouted_request_is_the_http_apis_404(
    plain: Served, method: str
) -> None:
    server = plain
    status, headers, body = server.request(method, "/nowhere")
    assert (status, json.loads(body)) == (404, {"message": "Not Found"})  # never HTML 501
    assert header(headers, "Content-Type") == ["application/json"]
    assert header(headers, "apigw-requestid")
    status, _, body = server.request("PUT", "/items/1")  # a known path, another method
    assert (status, json.loads(body)) == (404, {"message": "Not Found"})
    assert server.pools["Items"].events == []


@pytest.mark.parametrize("method", ["TRACE", "BREW", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"])
def test_with_a_catch_all_every_other_method_and_path_reaches_it(
    catch_all: Served, method: str
) -> None:
    server = catch_all
    server.pools["CatchAll"].result = answer(405, body='{"e": 1}')
    status, _, body = server.request(method, "/items/1")
    assert status == 405
    assert body == (b"" if method == "HEAD" else b'{"e": 1}')
    event = server.pools["CatchAll"].events[-1]
    assert (event["routeKey"], event["requestContext"]["routeKey"]) == ("$default", "$default")
    assert (event["requestContext"]["http"]["method"], event["rawPath"]) == (method, "/items/1")
    assert "pathParameters" not in event
    assert server.pools["Items"].events == []
    server.request("GET", "/items/1")
    assert server.pools["Items"].events[-1]["routeKey"] == "GET /items/{id}"


def test_the_function_gets_a_payload_2_event_of_the_request(plain: Served) -> None:
    server = plain
    server.request(
        "GET",
        "/items/7?s=a&s=b&q=%C3%BC",
        headers=[
            ("X-Tag", "one"),
            ("X-Tag", "two"),
            ("Cookie", "session=abc; theme=dark"),
            ("User-Agent", "probe/1"),
        ],
    )
    event = server.pools["Items"].events[-1]
    assert event["version"] == "2.0"
    assert event["headers"]["x-tag"] == "one,two"
    assert event["headers"]["user-agent"] == "probe/1"
    assert all(name == name.lower() for name in event["headers"])
    assert "cookie" not in event["headers"]
    assert event["cookies"] == ["session=abc", "theme=dark"]
    assert event["rawQueryString"] == "s=a&s=b&q=%C3%BC"
    assert event["queryStringParameters"] == {"s": "a,b", "q": "ü"}
    assert event["pathParameters"] == {"id": "7"}
    assert event["requestContext"]["http"]["sourceIp"] == "127.0.0.1"
    assert event["requestContext"]["http"]["userAgent"] == "probe/1"
    assert (event["requestContext"]["stage"], event["isBase64Encoded"]) == ("$default", False)

    server.request("POST", "/items", b'{"a": 1}', [("Content-Type", "application/json")])
    event = server.pools["Items"].events[-1]
    assert (event["body"], event["isBase64Encoded"]) == ('{"a": 1}', False)
    server.request("POST", "/items", b"\x00\xff", [("Content-Type", "application/octet-stream")])
    event = server.pools["Items"].events[-1]
    assert (base64.b64decode(event["body"]), event["isBase64Encoded"]) == (b"\x00\xff", True)
    server.request("POST", "/items", b'{"a": 1}')  # no Content-Type: base64, as HTTP APIs do
    event = server.pools["Items"].events[-1]
    assert (base64.b64decode(event["body"]), event["isBase64Encoded"]) == (b'{"a": 1}', True)


def test_results_map_back_as_an_http_api_maps_them(plain: Served) -> None:
    result: dict[str, Any] = {}
    server = plain
    server.pools["Items"].result = lambda event: Outcome(json.dumps(result).encode())

    result.update(
        statusCode=201,
        headers={"X-One": "1", "Content-Type": "application/octet-stream"},
        cookies=["a=1; HttpOnly", "b=2"],
        body=base64.b64encode(b"\x00bin").decode(),
        isBase64Encoded=True,
    )
    status, headers, body = server.request("GET", "/items/1")
    assert (status, body) == (201, b"\x00bin")
    assert header(headers, "X-One") == ["1"]
    assert header(headers, "Set-Cookie") == ["a=1; HttpOnly", "b=2"]
    assert header(headers, "Content-Length") == ["4"]
    assert len(header(headers, "apigw-requestid")) == 1

    result.clear()
    result.update(message="no statusCode", items=[1])
    status, headers, body = server.request("GET", "/items/1")
    assert (status, json.loads(body)) == (200, {"message": "no statusCode", "items": [1]})
    assert header(headers, "Content-Type") == ["application/json"]

    result.clear()
    result.update(statusCode="teapot")
    status, _, body = server.request("GET", "/items/1")
    assert (status, json.loads(body)) == (500, {"message": "Internal Server Error"})


def test_no_answer_within_the_integration_timeout_is_the_http_apis_503() -> None:
    """An HTTP API stops waiting for its integration after the route's TimeoutInMillis (a wait
    for a sandbox and a cold start count) and answers 503 itself; the function runs on. Before,
    the local gateway waited for as long as the function took."""
    slow = Route("GET", "/slow", "Slow", "$default", timeout_ms=300)
    server = Served([slow])
    try:
        release = threading.Event()
        server.pools["Slow"].result = lambda event: (release.wait(5), answer()(event))[1]
        started = time.monotonic()
        status, headers, body = server.request("GET", "/slow")
        assert (status, json.loads(body)) == (503, {"message": "Service Unavailable"})
        assert time.monotonic() - started < 2.0 and len(header(headers, "apigw-requestid")) == 1
        release.set()
        assert server.pools["Slow"].events  # the function was invoked, and ran on
        fast = server.request("GET", "/slow")  # a function that answers in time is heard
        assert fast[0] == 200
    finally:
        server.stop()


def test_a_failed_function_is_the_http_apis_500(plain: Served) -> None:
    server = plain
    server.pools["Items"].result = lambda event: Outcome.failed("ValueError", "boom")
    status, _, body = server.request("GET", "/items/1")
    assert (status, json.loads(body)) == (500, {"message": "Internal Server Error"})


def test_the_lambda_invoke_api_shares_the_port(catch_all: Served) -> None:
    server = catch_all
    server.pools["CatchAll"].result = lambda event: Outcome(json.dumps(event).encode())
    path = "/2015-03-31/functions/CatchAll/invocations"
    status, _, body = server.request("POST", path, b'{"k": 1}')
    assert (status, json.loads(body)) == (200, {"k": 1})  # the event itself, not an HTTP event
    status, headers, _ = server.request("TRACE", path)
    assert status == 405 and header(headers, "x-amzn-ErrorType")
    status, _, _ = server.request("POST", path, b"{}", [("X-Amz-Invocation-Type", "Event")])
    assert status == 202
    assert server.pools["CatchAll"].events[-1] == {}

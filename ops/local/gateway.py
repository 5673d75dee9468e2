"""The local stack's HTTP front door on 127.0.0.1:$API_PORT.

- The template's HttpApi routes, turned into payload format 2.0 events for their function
  (``apigw``). Any method reaches the routing (TRACE and methods nobody has heard of too):
  what no route serves goes to the ``$default`` route if the template has one, else gets the
  HTTP API's own ``{"message":"Not Found"}`` 404. As an HTTP API does, it answers a failed
  function (or an unusable result) with its own 500, and stops waiting after the route's
  ``TimeoutInMillis`` (30 s by default) with its own 503 ``{"message":"Service Unavailable"}``,
  the invocation running on - the wait for a free sandbox and a cold start count. (The api
  function answers before both: 503 ``unavailable`` with Retry-After; see its ``deadline``.)
- The Lambda Invoke API (``POST /2015-03-31/functions/<name>/invocations``), which the
  fan-out's boto3 client reaches through ``AWS_ENDPOINT_URL_LAMBDA``; ``aws lambda invoke
  --endpoint-url`` works too.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit

from ops.local import apigw
from ops.local.lambdas import FunctionPool, Outcome
from ops.local.spec import StackSpec

INVOKE_PREFIX = "/2015-03-31/functions/"
INVOKE_SUFFIX = "/invocations"


class Gateway(ThreadingHTTPServer):
    daemon_threads = True
    # SO_REUSEADDR (the default) lets a restart bind over TIME_WAIT; a live listener still
    # makes the bind fail, which is what a busy port must do.
    allow_reuse_address = True

    def __init__(
        self,
        port: int,
        stack: StackSpec,
        pools: dict[str, FunctionPool],
        access_log: Callable[[str], None],
    ) -> None:
        self.stack = stack
        self.pools = pools
        self.access_log = access_log
        super().__init__(("127.0.0.1", port), _Handler)

    def serve_in_background(self) -> threading.Thread:
        thread = threading.Thread(target=self.serve_forever, name="gateway", daemon=True)
        thread.start()
        return thread


class _Handler(BaseHTTPRequestHandler):
    server: Gateway
    protocol_version = "HTTP/1.1"

    def do_any(self) -> None:
        started = time.monotonic()
        url = urlsplit(self.path)
        path = unquote(url.path)
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        if path.startswith(INVOKE_PREFIX) and path.endswith(INVOKE_SUFFIX):
            response = self._invoke(path[len(INVOKE_PREFIX) : -len(INVOKE_SUFFIX)], body)
        else:
            response = self._api(path, url.query, body)
            elapsed = (time.monotonic() - started) * 1000
            self.server.access_log(f"{self.command} {self.path} {response.status} {elapsed:.0f}ms")
        self._send(response)

    def __getattr__(self, name: str) -> Any:
        # BaseHTTPRequestHandler looks up do_<METHOD> and answers a missing one with its own
        # HTML 501 page; an HTTP API routes every method, so every method reaches do_any.
        if name.startswith("do_"):
            return self.do_any
        raise AttributeError(name)

    def _api(self, path: str, query: str, body: bytes) -> apigw.HttpResponse:
        found = self.server.stack.route(self.command, path)
        if found is None:
            return apigw.gateway_response(404)
        route, params = found
        event = apigw.proxy_event(
            self.command,
            path,
            route_key=route.key,
            path_params=params,
            stage=route.stage,
            headers=list(self.headers.items()),
            query=query,
            body=body,
            source_ip=self.client_address[0],
        )
        request_id = event["requestContext"]["requestId"]
        outcome = _within(route.timeout_ms / 1000, self.server.pools[route.function].invoke, event)
        if outcome is None:  # the integration timeout: the function runs on, unheard
            return apigw.gateway_response(503, request_id)
        response = None if outcome.function_error else apigw.from_proxy_result(outcome.payload)
        if response is None:  # the function failed, or its result is not one API Gateway can use
            return apigw.gateway_response(500, request_id)
        return apigw.HttpResponse(
            response.status, [*response.headers, ("apigw-requestid", request_id)], response.body
        )

    def _invoke(self, function: str, body: bytes) -> apigw.HttpResponse:
        # FunctionName may be a name, an ARN or a partial ARN, with an optional :qualifier.
        name = function.split("function:")[-1].split(":")[0]
        pool = self.server.pools.get(name)
        if self.command != "POST":
            return _lambda_error(405, "InvalidRequestContentException", "use POST")
        if pool is None:
            arn = self.server.stack.function_arn(name)
            return _lambda_error(404, "ResourceNotFoundException", f"Function not found: {arn}")
        try:
            event: Any = json.loads(body) if body else {}
        except ValueError:
            return _lambda_error(400, "InvalidRequestContentException", "payload is not JSON")
        kind = self.headers.get("X-Amz-Invocation-Type", "RequestResponse")
        if kind == "DryRun":
            return apigw.HttpResponse(204)
        if kind == "Event":
            pool.invoke_async(event)
            return apigw.HttpResponse(202)
        outcome = pool.invoke(event)
        headers = [("Content-Type", "application/json"), ("X-Amz-Executed-Version", "$LATEST")]
        if outcome.function_error:
            headers.append(("X-Amz-Function-Error", outcome.function_error))
        return apigw.HttpResponse(200, headers, outcome.payload)

    def _send(self, response: apigw.HttpResponse) -> None:
        self.send_response(response.status)
        for name, value in response.headers:
            if name.lower() not in ("content-length", "connection", "transfer-encoding"):
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(response.body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(response.body)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # do_any logs API requests itself; Lambda API calls are internal chatter


def _within(timeout_s: float, invoke: Callable[[Any], Outcome], event: Any) -> Outcome | None:
    """``invoke(event)``, or None if it has not returned within ``timeout_s`` - as an HTTP API
    stops waiting for its integration (a wait for a free sandbox and a cold start count), while
    the invocation carries on."""
    result: list[Outcome] = []
    thread = threading.Thread(
        target=lambda: result.append(invoke(event)), name="gateway-invoke", daemon=True
    )
    thread.start()
    thread.join(timeout_s)
    return result[0] if result else None


def _lambda_error(status: int, error_type: str, message: str) -> apigw.HttpResponse:
    body = json.dumps({"Type": "User", "Message": message}).encode()
    headers = [("Content-Type", "application/json"), ("x-amzn-ErrorType", error_type)]
    return apigw.HttpResponse(status, headers, body)

"""The local stack's HTTP front door on 127.0.0.1:$API_PORT.

- The template's Api routes, turned into proxy events for their function (``apigw``).
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
from urllib.parse import parse_qsl, unquote, urlsplit

from ops.local import apigw
from ops.local.lambdas import FunctionPool
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
            response = self._api(path, parse_qsl(url.query, keep_blank_values=True), body)
            elapsed = (time.monotonic() - started) * 1000
            self.server.access_log(f"{self.command} {self.path} {response.status} {elapsed:.0f}ms")
        self._send(response)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = do_any

    def _api(self, path: str, query: list[tuple[str, str]], body: bytes) -> apigw.HttpResponse:
        stack = self.server.stack
        found = stack.route(self.command, path)
        if found is None:
            return apigw.gateway_response("MISSING_AUTHENTICATION_TOKEN", stack.gateway_responses)
        route, params = found
        event = apigw.proxy_event(
            self.command,
            path,
            resource=route.resource,
            path_params=params,
            stage=route.stage,
            headers=list(self.headers.items()),
            query=query,
            body=body,
            source_ip=self.client_address[0],
        )
        outcome = self.server.pools[route.function].invoke(event)
        if outcome.function_error:
            return apigw.gateway_response("INTEGRATION_FAILURE", stack.gateway_responses)
        response = apigw.from_proxy_result(outcome.payload)
        if response is None:
            return apigw.gateway_response("BAD_RESPONSE", stack.gateway_responses)
        request_id = event["requestContext"]["requestId"]
        return apigw.HttpResponse(
            response.status, [*response.headers, ("x-amzn-RequestId", request_id)], response.body
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


def _lambda_error(status: int, error_type: str, message: str) -> apigw.HttpResponse:
    body = json.dumps({"Type": "User", "Message": message}).encode()
    headers = [("Content-Type", "application/json"), ("x-amzn-ErrorType", error_type)]
    return apigw.HttpResponse(status, headers, body)

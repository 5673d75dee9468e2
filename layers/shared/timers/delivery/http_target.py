"""One webhook POST, guarded against server-side request forgery.

- **Resolution**: the host name is resolved once; if any of its addresses is refused (see
  timers.core.webhooks.address_allowed) the attempt is ``blocked_address``. The connection then
  goes to one of the vetted addresses - never to a second resolution, so a name cannot resolve
  to a public address for the check and to a private one for the connect (DNS rebinding).
- **Connect**: the socket's peer address is checked again once connected.
- TLS is verified against the URL's host name (SNI too), redirects are never followed (a 3xx
  is an answer, and a failure), at most RESPONSE_BODY_MAX bytes of the answer are read (the
  first ANSWER_KEPT_BYTES kept as text for the fire's ``last_error``), and the whole attempt
  ends within its timeout; its latency is measured.

Only the standard library: the delivery function needs nothing more in its layer.
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any
from urllib.parse import urlsplit

from timers.core.webhook_attempts import (
    ANSWER_KEPT_BYTES,
    ATTEMPT_TIMEOUT_S,
    RESPONSE_BODY_MAX,
    Attempt,
    parse_retry_after,
)
from timers.core.webhooks import address_allowed

Resolver = Callable[[str, int], list[str]]
USER_AGENT = "timers-webhooks/1"


def resolve(host: str, port: int) -> list[str]:
    """Every address of ``host`` (A and AAAA), in the resolver's order."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


class _Blocked(Exception):
    pass


class _PinnedHTTPConnection(http.client.HTTPConnection):
    """Connects to a vetted address; checks the peer once connected."""

    def __init__(self, host: str, port: int, address: str, allow_loopback: bool,
                 timeout: float) -> None:  # fmt: skip
        super().__init__(host, port, timeout=timeout)
        self._address = address
        self._allow_loopback = allow_loopback

    def _open(self) -> socket.socket:
        sock = socket.create_connection((self._address, self.port), self.timeout)
        peer = sock.getpeername()[0]
        if not address_allowed(str(peer), self._allow_loopback):
            sock.close()
            raise _Blocked(str(peer))
        return sock

    def connect(self) -> None:
        self.sock = self._open()
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class _PinnedHTTPSConnection(_PinnedHTTPConnection):
    def __init__(self, host: str, port: int, address: str, allow_loopback: bool,
                 timeout: float, context: ssl.SSLContext) -> None:  # fmt: skip
        super().__init__(host, port, address, allow_loopback, timeout)
        self._context = context

    def connect(self) -> None:
        sock = self._open()
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)


_TLS = ssl.create_default_context()


def post(
    url: str,
    body: bytes,
    headers: Mapping[str, str],
    *,
    allow_loopback: bool = False,
    timeout_s: float = ATTEMPT_TIMEOUT_S,
    resolver: Resolver | None = None,  # None: ``resolve``, looked up now (tests replace it)
    clock: Callable[[], float] = time.monotonic,
) -> Attempt:
    """POST ``body`` to ``url``; the answer's status and start, or why there was none; and
    how long it took."""
    started = clock()
    attempt = _post(url, body, headers, allow_loopback, timeout_s, resolver, clock)
    return replace(attempt, latency_ms=max(0, round((clock() - started) * 1000)))


def _post(
    url: str,
    body: bytes,
    headers: Mapping[str, str],
    allow_loopback: bool,
    timeout_s: float,
    resolver: Resolver | None,
    clock: Callable[[], float],
) -> Attempt:
    parts = urlsplit(url)
    host = parts.hostname or ""
    https = parts.scheme == "https"
    port = parts.port or (443 if https else 80)
    if parts.scheme not in ("http", "https") or not host:
        return Attempt(error="invalid_target")
    if not https and not allow_loopback:  # plain http only to loopback, on the local stack
        return Attempt(error="invalid_target")
    started = clock()
    try:
        addresses = (resolver or resolve)(host, port)
    except UnicodeError:  # the name does not IDNA-encode: it never will
        return Attempt(error="invalid_target")
    except OSError:
        return Attempt(error="connection_error")
    if not addresses or not all(address_allowed(a, allow_loopback) for a in addresses):
        return Attempt(error="blocked_address")
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    left = max(0.1, timeout_s - (clock() - started))
    conn: Any
    if https:
        conn = _PinnedHTTPSConnection(host, port, addresses[0], allow_loopback, left, _TLS)
    else:
        conn = _PinnedHTTPConnection(host, port, addresses[0], allow_loopback, left)
    try:
        _put_request(conn, path, headers, len(body))
    except (http.client.InvalidURL, ValueError):  # UnicodeEncodeError is a ValueError
        # http.client refuses the request line or a header (a target stored before validation
        # caught it): no retry would change that.
        conn.close()
        return Attempt(error="invalid_target")
    # Socket timeouts bound each read, not the whole answer (a server may trickle bytes): a
    # watchdog shuts the socket down when the attempt's time is up.
    cut = threading.Event()
    watchdog = threading.Timer(max(0.1, timeout_s - (clock() - started)), _abort, (conn, cut))
    watchdog.daemon = True
    watchdog.start()
    try:
        conn.endheaders(body)  # connects, then sends
        if conn.sock is not None:  # the rest of the budget for the answer
            conn.sock.settimeout(max(0.1, timeout_s - (clock() - started)))
        response = conn.getresponse()
        answer = response.read(RESPONSE_BODY_MAX)  # a little (keeps some servers happy)
        if cut.is_set():
            return Attempt(error="timeout")  # the watchdog cut a trickle short
        retry_after = parse_retry_after(response.getheader("retry-after"))
        kept = answer[:ANSWER_KEPT_BYTES].decode("utf-8", errors="replace")
        return Attempt(status=response.status, retry_after_s=retry_after, body=kept)
    except _Blocked:
        return Attempt(error="blocked_address")
    except TimeoutError:
        return Attempt(error="timeout")
    except (OSError, http.client.HTTPException, ssl.SSLError, ValueError):
        if cut.is_set():
            return Attempt(error="timeout")  # the watchdog ended it
        return Attempt(error="connection_error")
    finally:
        watchdog.cancel()
        conn.close()


def _put_request(conn: Any, path: str, headers: Mapping[str, str], length: int) -> None:
    """Buffer the request line and headers; http.client checks each here, before connecting."""
    conn.putrequest("POST", path, skip_accept_encoding=True)
    sent = {k.lower(): v for k, v in headers.items() if k.lower() != "content-type"}
    sent.setdefault("user-agent", USER_AGENT)
    for name, value in sent.items():
        conn.putheader(name, value)
    conn.putheader("content-type", "application/json")
    conn.putheader("content-length", str(length))


def _abort(conn: Any, cut: threading.Event) -> None:
    cut.set()
    sock = getattr(conn, "sock", None)
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)

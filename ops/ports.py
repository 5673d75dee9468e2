"""Local TCP ports on 127.0.0.1: the local stack, its tests and the test Redis servers use them."""

from __future__ import annotations

import contextlib
import socket


def port_is_free(port: int) -> bool:
    """Whether a server could listen on ``127.0.0.1:port`` now. Like the servers we start, it
    sets SO_REUSEADDR: connections of a server that just stopped linger in TIME_WAIT on its
    port, which blocks a plain bind but not a restart (and never hides a live listener)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port() -> int:
    """A port the OS just had free (another process may still take it before we bind)."""
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports the OS just had free: held open together, so two calls in a row
    cannot be handed the same port (one just closed is free again at once)."""
    with contextlib.ExitStack() as held:
        sockets = [held.enter_context(socket.socket()) for _ in range(count)]
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]

"""In-process moto is not thread-safe on one item (it deep-copies an item while another thread's
update changes it); DynamoDB is. Where code under test calls one client from threads - the
delivery function's batch - the client's calls take turns."""

from __future__ import annotations

import threading
from typing import Any


def one_call_at_a_time(client: Any, lock: threading.Lock | None = None) -> Any:
    """``client`` with its calls serialized by ``lock`` (a new one unless shared)."""
    turn = lock or threading.Lock()

    class Serialized:
        def __getattr__(self, name: str) -> Any:
            attr = getattr(client, name)
            if not callable(attr):
                return attr

            def serialized(*args: Any, **kwargs: Any) -> Any:
                with turn:
                    return attr(*args, **kwargs)

            return serialized

    return Serialized()

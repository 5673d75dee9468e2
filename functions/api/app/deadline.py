"""Every request is answered in time: a slow or cold api answers 503 ``unavailable`` with
``Retry-After`` (the contract's error body), never API Gateway's 500.

A Lambda function that runs past its Timeout is killed, and the HTTP API answers that - and any
function error - with its own ``500 {"message": "Internal Server Error"}``; HTTP APIs have no
gateway responses to reshape it (template.yaml). So the function keeps its own deadline: the
earlier of :data:`ANSWER_WITHIN_MS` after the request reached the gateway (the event's
``requestContext.timeEpoch``: a cold start and any wait for a sandbox count) and
:data:`TIMEOUT_MARGIN_MS` before the function's own timeout. A request that reaches the function
after its deadline is answered at once; one still running at it is interrupted (``SIGALRM``
raises :class:`Late` in the handler's thread, at the next bytecode, a blocking socket read
included) and answered. Work cut off is cut where a Lambda timeout would have cut it - the
stores are built for that - but the caller is told to retry, and an ``Idempotency-Key`` makes
the retry of a create safe. So only a request that would have been a 500 (or API Gateway's
own 503 at its 30 s integration timeout) becomes this 503: a slow answer that comes in time
is still the answer.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

ANSWER_WITHIN_MS = 25_000
"""From the request's arrival at the gateway (a cold start and a wait for a sandbox count);
below the HTTP API's integration timeout (30 s), so the caller gets this 503 rather than API
Gateway's own."""
TIMEOUT_MARGIN_MS = 1_000
"""Before the function's own timeout: time to answer, log and flush metrics."""
INTEGRATION_TIMEOUT_MS = 30_000
"""The HTTP API's: an event that arrived longer ago than this is no live request (API Gateway
stopped waiting for it) but a replayed or sample one (``sam local invoke -e events/...``), and
only the function's timeout bounds it."""


class Late(BaseException):
    """The request's deadline passed. A BaseException: code that catches Exception to carry on
    (a limiter failing open, a best-effort write) must not swallow it."""


def deadline_ms(event: dict[str, Any], remaining_ms: int, now_ms: int | None = None) -> int:
    """The epoch ms by which the answer must leave the function."""
    now = time.time_ns() // 1_000_000 if now_ms is None else now_ms
    deadline = now + remaining_ms - TIMEOUT_MARGIN_MS
    arrived = (event.get("requestContext") or {}).get("timeEpoch")
    if (
        isinstance(arrived, int)
        and not isinstance(arrived, bool)
        and 0 <= now - arrived <= INTEGRATION_TIMEOUT_MS
    ):
        deadline = min(deadline, arrived + ANSWER_WITHIN_MS)
    return deadline


@contextmanager
def answer_by(deadline: int) -> Iterator[None]:
    """Raise :class:`Late` in this block at ``deadline`` (epoch ms), or at once if it passed.
    The block owns SIGALRM and the real-time interval timer (nothing else in a Lambda sandbox
    uses them); outside the main thread (no signals there) it just runs."""
    left_s = (deadline - time.time_ns() // 1_000_000) / 1000
    if left_s <= 0:
        raise Late
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    armed = [True]

    def fire(signum: int, frame: FrameType | None) -> None:
        if armed[0]:
            armed[0] = False
            raise Late

    previous = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, left_s)
    try:
        yield
    finally:
        armed[0] = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)

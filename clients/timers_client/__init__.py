"""Python SDK of the timer service: ``Client`` (httpx), typed models, and errors that carry the
contract's ``code`` and ``details``. The ``timers`` command (``timers_client.cli``) is built on it.

    from timers_client import Client, after, every

    with Client.from_env() as timers:           # TIMERS_API / TIMERS_API_KEY, or `make run`'s
        t = timers.create(after(30), payload={"a": 1})
        for timer in timers.list(status="active"):   # follows next_cursor
            print(timer.id, timer.next_fire_at)
"""

from timers_client.client import (
    OPERATIONS,
    Client,
    Config,
    after,
    at,
    cron,
    every,
)
from timers_client.errors import (
    ApiError,
    Conflict,
    InvalidState,
    MethodNotAllowed,
    NotFound,
    PayloadTooLarge,
    RateLimited,
    Unauthorized,
    UnsupportedMediaType,
    ValidationError,
)
from timers_client.models import (
    FailedFire,
    Fire,
    Group,
    GroupChange,
    Key,
    Page,
    Preview,
    Tenant,
    Timer,
)

__all__ = [
    "OPERATIONS",
    "ApiError",
    "Client",
    "Config",
    "Conflict",
    "FailedFire",
    "Fire",
    "Group",
    "GroupChange",
    "InvalidState",
    "Key",
    "MethodNotAllowed",
    "NotFound",
    "Page",
    "PayloadTooLarge",
    "Preview",
    "RateLimited",
    "Tenant",
    "Timer",
    "Unauthorized",
    "UnsupportedMediaType",
    "ValidationError",
    "after",
    "at",
    "cron",
    "every",
]

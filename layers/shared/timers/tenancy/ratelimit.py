"""Per-tenant request rate limit: a fixed one-second window counted in Redis."""

from __future__ import annotations

import logging
from typing import Any, Protocol

log = logging.getLogger(__name__)

# INCR the window's counter and give it a short life on first use; one round trip.
_COUNT = """
local n = redis.call('INCR', KEYS[1])
if n == 1 then redis.call('PEXPIRE', KEYS[1], ARGV[1]) end
return n
"""


class ScriptingClient(Protocol):
    def register_script(self, script: str) -> Any: ...


class RateLimiter:
    def __init__(self, client: ScriptingClient, clock_ms: Any) -> None:
        self._count = client.register_script(_COUNT)
        self._clock_ms = clock_ms

    def allow(self, who: str, per_second: int) -> bool:
        """Whether ``who`` (a tenant, or ``ip:<address>``) is within ``per_second`` this second."""
        window = self._clock_ms() // 1000
        try:
            count = int(self._count(keys=[f"rl:{{{who}}}:{window}"], args=[2000]))
        except Exception:  # fail open: losing Redis must not take the API down with it
            log.warning("rate limiter unavailable; allowing", exc_info=True)
            return True
        return count <= per_second

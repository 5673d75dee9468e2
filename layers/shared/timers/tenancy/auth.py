"""Who a request's API key names, remembered per api sandbox: a busy api reads the tenants
table about once per key per AUTH_CACHE_MS, and a revoked key is refused within
REVOCATION_CHECK_MS everywhere (it reads the revocation count, timers.tenancy.keys)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from timers.core.errors import RateLimited
from timers.tenancy.keys import key_hash
from timers.tenancy.table import Tenant

AUTH_CACHE_MS = 30_000
"""An api sandbox remembers a key's tenant this long (a tenant's changes reach it within it)."""
REVOCATION_CHECK_MS = 1_000
"""How often a sandbox that trusts remembered keys reads the revocation count: a revoked key
is refused within this, in every sandbox (one consistent read, 1 RRU, per busy sandbox-second)."""
AUTH_CACHE_SIZE = 10_000
"""Keys remembered per api sandbox, of each kind (naming a tenant, naming none)."""


class CachedAuthenticator:
    """``lookup`` (a TenantStore's ``authenticate``) with a per-instance memory of recent
    answers (hashed keys only), so a busy api reads the tenants table about once per key per
    AUTH_CACHE_MS, not per request. Before it trusts a remembered key it reads the revocation
    count (``revocations``, the store's ``revocation_count``), at most once per
    REVOCATION_CHECK_MS; when the count moved it forgets every key it remembered, so a revoked
    key is refused within that, whichever process revoked it.

    Keys that name a tenant and keys that do not are remembered apart, each bounded, oldest
    out first: a flood of made-up keys pushes out only made-up keys. A key not remembered costs
    a read of the tenants table, so it is looked up only when ``may_look_up()`` allows (the api
    passes its caller's address's rate); otherwise RateLimited.
    """

    def __init__(
        self,
        clock: Callable[[], int],
        lookup: Callable[[str | None], Tenant | None],
        revocations: Callable[[], int],
        ttl_ms: int = AUTH_CACHE_MS,
        size: int = AUTH_CACHE_SIZE,
    ) -> None:
        self._clock = clock
        self._lookup = lookup
        self._ttl_ms = ttl_ms
        self._size = size
        self._revocations = revocations
        self._revoked: int | None = None  # the count last read; None: never read
        self._revoked_read_ms: int | None = None
        self._known: OrderedDict[str, tuple[int, Tenant]] = OrderedDict()
        self._unknown: OrderedDict[str, int] = OrderedDict()

    def __call__(
        self, api_key: str | None, may_look_up: Callable[[], bool] = lambda: True
    ) -> Tenant | None:
        if not api_key:
            return None
        digest, now = key_hash(api_key), self._clock()
        if digest in self._known:
            self._forget_if_revoked(now)
        if (known := self._known.get(digest)) and now - known[0] < self._ttl_ms:
            return known[1]
        if (unknown := self._unknown.get(digest)) is not None and now - unknown < self._ttl_ms:
            return None
        if not may_look_up():
            raise RateLimited("too many new API keys from this address; retry shortly")
        if self._revoked is None:
            # Read before the first lookup: a revocation after it moves the count this saw.
            self._revoked, self._revoked_read_ms = self._revocations(), now
        tenant = self._lookup(api_key)
        if tenant is None:
            self._remember(self._unknown, digest, now)
            self._known.pop(digest, None)  # revoked
        else:
            self._remember(self._known, digest, (now, tenant))
            self._unknown.pop(digest, None)
        return tenant

    def _forget_if_revoked(self, now: int) -> None:
        """Forget every remembered key if a key was revoked since the count was last read."""
        last = self._revoked_read_ms
        if last is not None and now - last < REVOCATION_CHECK_MS:
            return
        count = self._revocations()
        if count != self._revoked:
            self._known.clear()
        self._revoked, self._revoked_read_ms = count, now

    def _remember(self, memory: OrderedDict[str, Any], digest: str, value: Any) -> None:
        memory[digest] = value
        memory.move_to_end(digest)
        while len(memory) > self._size:
            memory.popitem(last=False)

"""Redis index of due timer occurrences: bucketed zsets with an atomic lease/ack protocol.

Redis is only an index (DynamoDB is the truth), so every operation here is safe to repeat and
whatever Redis loses the migrator rebuilds. A fire occurrence is the member
``"<tenant>|<timer_id>|<due_ms>"``. Per bucket ``b`` there are three keys sharing the hash tag
``{b<b>}`` so that every script touches one slot (ElastiCache cluster mode and Serverless reject
cross-slot scripts):

- ``<prefix>:{b<b>}:due``   zset member -> due_ms, waiting to fire
- ``<prefix>:{b<b>}:lease`` zset member -> lease deadline ms, in flight at a trigger
- ``<prefix>:{b<b>}:owner`` hash member -> owner token of that lease

A member is in at most one of ``due`` and ``lease``. Scripts are plain Lua run by EVALSHA with an
EVAL fallback, compatible with Redis 6.2 (ElastiCache has no Redis 7 ``FUNCTION``).
"""

from __future__ import annotations

import hashlib
import zlib
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from redis.exceptions import NoScriptError

# Members added per script call: bounds how long one call blocks Redis on a big migrator batch.
ADD_CHUNK = 500

# add. KEYS: due, lease. ARGV: score, member, ... ZADD unless leased (in flight elsewhere).
ADD_LUA = """
local added = 0
for i = 1, #ARGV, 2 do
  if not redis.call('ZSCORE', KEYS[2], ARGV[i + 1]) then
    added = added + redis.call('ZADD', KEYS[1], ARGV[i], ARGV[i + 1])
  end
end
return added
"""

# lease. KEYS: due, lease, owner. ARGV: now_ms, deadline_ms, limit, owner.
# Expired leases go back to due (score = due_ms from the member), then up to limit due members
# with score <= now (oldest first) move into lease under owner. Returns {members, reclaimed}.
LEASE_LUA = """
local expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', ARGV[1])
for _, m in ipairs(expired) do
  redis.call('ZREM', KEYS[2], m)
  redis.call('HDEL', KEYS[3], m)
  redis.call('ZADD', KEYS[1], string.match(m, '|(%-?%d+)$'), m)
end
local taken = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, ARGV[3])
for _, m in ipairs(taken) do
  redis.call('ZREM', KEYS[1], m)
  redis.call('ZADD', KEYS[2], ARGV[2], m)
  redis.call('HSET', KEYS[3], m, ARGV[4])
end
return {taken, #expired}
"""

# ack. KEYS: lease, owner. ARGV: owner, member, ... Forget members this owner still holds.
ACK_LUA = """
local n = 0
for i = 2, #ARGV do
  if redis.call('HGET', KEYS[2], ARGV[i]) == ARGV[1] then
    redis.call('ZREM', KEYS[1], ARGV[i])
    redis.call('HDEL', KEYS[2], ARGV[i])
    n = n + 1
  end
end
return n
"""

# extend. KEYS: lease, owner. ARGV: owner, deadline_ms, member, ... Renew this owner's leases.
EXTEND_LUA = """
local n = 0
for i = 3, #ARGV do
  if redis.call('HGET', KEYS[2], ARGV[i]) == ARGV[1] then
    redis.call('ZADD', KEYS[1], 'XX', ARGV[2], ARGV[i])
    n = n + 1
  end
end
return n
"""

# release. KEYS: due, lease, owner. ARGV: owner, member, ... Hand this owner's leases back to due.
RELEASE_LUA = """
local n = 0
for i = 2, #ARGV do
  local m = ARGV[i]
  if redis.call('HGET', KEYS[3], m) == ARGV[1] then
    redis.call('ZREM', KEYS[2], m)
    redis.call('HDEL', KEYS[3], m)
    redis.call('ZADD', KEYS[1], string.match(m, '|(%-?%d+)$'), m)
    n = n + 1
  end
end
return n
"""

# Lock renew. KEYS: lock. ARGV: token, ttl_ms. PEXPIRE only while the lock holds our token.
LOCK_RENEW_LUA = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""

# Lock release. KEYS: lock. ARGV: token. DEL only while the lock holds our token.
LOCK_RELEASE_LUA = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


class ScriptPort(Protocol):
    """A registered script (redis-py ``Script``): EVALSHA, loading the script on NOSCRIPT."""

    def __call__(self, keys: Sequence[str], args: Sequence[str | int]) -> Any: ...


class PipelinePort(Protocol):
    """The pipeline commands used; results arrive from ``execute``."""

    def execute_command(self, *args: str | int) -> Any: ...
    def zcount(self, name: str, min: str | int, max: str | int) -> Any: ...
    def zcard(self, name: str) -> Any: ...
    def zrem(self, name: str, *values: str) -> Any: ...
    def execute(self, raise_on_error: bool = True) -> list[Any]: ...


class RedisPort(Protocol):
    """The Redis commands used for timers; ``redis.Redis`` and ``redis.RedisCluster`` fit.

    (types-redis stubs omit ``RedisCluster.register_script``, which exists at runtime.)
    """

    def register_script(self, script: str) -> ScriptPort: ...
    def pipeline(self, transaction: bool = True) -> PipelinePort: ...
    def set(self, name: str, value: str, *, px: int | None = None, nx: bool = False) -> Any: ...
    def zrange(self, name: str, start: int, end: int, *, withscores: bool = False) -> Any: ...


class _Script:
    """A script registered once, plus its SHA1, which pipelined EVALSHA needs."""

    def __init__(self, client: RedisPort, text: str) -> None:
        self.call = client.register_script(text)
        self.sha = hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()


class BucketKeys(NamedTuple):
    due: str
    lease: str
    owner: str


@dataclass(frozen=True)
class Leased:
    """Members leased by one ``lease`` call, and how many expired leases it put back first."""

    members: list[str]
    reclaimed: int


Item = tuple[str, str, int]  # (tenant, timer_id, due_ms)


def member(tenant: str, timer_id: str, due_ms: int) -> str:
    """The member string of one fire occurrence."""
    if "|" in tenant:  # the tenant is the text before the first "|"
        raise ValueError("tenant must not contain '|'")
    return f"{tenant}|{timer_id}|{due_ms:d}"


def parse_member(m: str) -> tuple[str, str, int]:
    """(tenant, timer_id, due_ms) of a member; timer ids may contain '|', tenants may not."""
    tenant, rest = m.split("|", 1)
    timer_id, due = rest.rsplit("|", 1)
    return tenant, timer_id, int(due)


def bucket_of(timer_id: str, bucket_count: int) -> int:
    """Stable bucket of a timer: crc32 is the same in every process (``hash()`` is salted)."""
    return zlib.crc32(timer_id.encode()) % bucket_count


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class RedisIndex:
    """Due occurrences in ``bucket_count`` buckets, leased atomically by triggers."""

    def __init__(self, client: RedisPort, bucket_count: int, prefix: str = "tq") -> None:
        if bucket_count < 1:
            raise ValueError("bucket_count must be >= 1")
        self._client = client
        self.bucket_count = bucket_count
        self.prefix = prefix
        self._add = _Script(client, ADD_LUA)
        self._lease = _Script(client, LEASE_LUA)
        self._ack = _Script(client, ACK_LUA)
        self._extend = _Script(client, EXTEND_LUA)
        self._release = _Script(client, RELEASE_LUA)

    def keys(self, bucket: int) -> BucketKeys:
        """The keys of one bucket; they share the hash tag ``{b<bucket>}``."""
        if not 0 <= bucket < self.bucket_count:
            raise ValueError(f"bucket {bucket} outside 0..{self.bucket_count - 1}")
        base = f"{self.prefix}:{{b{bucket}}}"
        return BucketKeys(f"{base}:due", f"{base}:lease", f"{base}:owner")

    def add(self, items: Iterable[Item]) -> int:
        """Schedule occurrences; skips those already due or in flight. Returns how many are new."""
        calls: list[tuple[list[str], list[str | int]]] = []
        for bucket, scored in self._by_bucket(items).items():
            k = self.keys(bucket)
            for start in range(0, len(scored), ADD_CHUNK):
                args: list[str | int] = []
                for due_ms, m in scored[start : start + ADD_CHUNK]:
                    args += [due_ms, m]
                calls.append(([k.due, k.lease], args))
        return sum(self._eval_pipelined(self._add, calls))

    def lease(self, bucket: int, now_ms: int, lease_ms: int, limit: int, owner: str) -> Leased:
        """Atomically reclaim expired leases, then lease up to ``limit`` members due by now.

        Concurrent callers get disjoint members, so several triggers can share one bucket.
        """
        if lease_ms < 1 or limit < 0:
            raise ValueError("lease_ms must be >= 1 and limit >= 0")
        k = self.keys(bucket)
        taken, reclaimed = self._lease.call(
            [k.due, k.lease, k.owner], [now_ms, now_ms + lease_ms, limit, owner]
        )
        return Leased([_text(m) for m in taken], int(reclaimed))

    def ack(self, bucket: int, owner: str, members: Sequence[str]) -> int:
        """Forget finished members still leased by ``owner``; returns how many."""
        if not members:
            return 0
        k = self.keys(bucket)
        return int(self._ack.call([k.lease, k.owner], [owner, *members]))

    def extend(
        self, bucket: int, owner: str, members: Sequence[str], now_ms: int, lease_ms: int
    ) -> int:
        """Push the lease deadline of members still held by ``owner`` to now + lease_ms."""
        if not members:
            return 0
        k = self.keys(bucket)
        return int(self._extend.call([k.lease, k.owner], [owner, now_ms + lease_ms, *members]))

    def release(self, bucket: int, owner: str, members: Sequence[str]) -> int:
        """Give members still held by ``owner`` back to due at once (work it won't finish)."""
        if not members:
            return 0
        k = self.keys(bucket)
        return int(self._release.call([k.due, k.lease, k.owner], [owner, *members]))

    def remove(self, items: Iterable[Item]) -> int:
        """Drop occurrences from due (timer cancelled). Leased ones are left to the trigger,
        whose DynamoDB re-check drops them."""
        by_bucket = self._by_bucket(items)
        if not by_bucket:
            return 0
        pipe = self._client.pipeline(transaction=False)
        for bucket, scored in by_bucket.items():
            pipe.zrem(self.keys(bucket).due, *(m for _, m in scored))
        return sum(pipe.execute())

    def due_counts(self, buckets: Sequence[int], now_ms: int) -> dict[int, int]:
        """Work per bucket in one round trip: due members plus expired leases (to be reclaimed).

        Only buckets with work appear.
        """
        if not buckets:
            return {}
        pipe = self._client.pipeline(transaction=False)
        for bucket in buckets:
            k = self.keys(bucket)
            pipe.zcount(k.due, "-inf", now_ms)
            pipe.zcount(k.lease, "-inf", now_ms)
        counts = pipe.execute()
        totals = {b: counts[2 * i] + counts[2 * i + 1] for i, b in enumerate(buckets)}
        return {b: n for b, n in totals.items() if n}

    def next_due(self, bucket: int) -> int | None:
        """Earliest due_ms waiting in the bucket (leased members excluded), or None."""
        first = self._client.zrange(self.keys(bucket).due, 0, 0, withscores=True)
        return int(first[0][1]) if first else None

    def size(self, bucket: int) -> tuple[int, int]:
        """(due, leased) member counts of the bucket."""
        k = self.keys(bucket)
        pipe = self._client.pipeline(transaction=False)
        pipe.zcard(k.due)
        pipe.zcard(k.lease)
        due, leased = pipe.execute()
        return int(due), int(leased)

    def _by_bucket(self, items: Iterable[Item]) -> dict[int, list[tuple[int, str]]]:
        """(due_ms, member) pairs grouped by bucket."""
        grouped: dict[int, list[tuple[int, str]]] = defaultdict(list)
        for tenant, timer_id, due_ms in items:
            grouped[bucket_of(timer_id, self.bucket_count)].append(
                (due_ms, member(tenant, timer_id, due_ms))
            )
        return grouped

    def _eval_pipelined(
        self, script: _Script, calls: Sequence[tuple[list[str], list[str | int]]]
    ) -> list[Any]:
        """EVALSHA every call in one round trip (redis-py's own pipeline script support costs a
        SCRIPT EXISTS round trip per execute, and its cluster pipeline has none).

        After a SCRIPT FLUSH or failover the calls meet NOSCRIPT: the first is redone through
        the registered script, which loads it, and the rest are pipelined again.
        """
        if not calls:
            return []
        pipe = self._client.pipeline(transaction=False)
        for keys, args in calls:
            # execute_command: redis-py's cluster pipeline blocks its evalsha() method (not the
            # command); every call here is single-slot, so it routes like any keyed command.
            pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
        results = pipe.execute(raise_on_error=False)
        missing = [i for i, result in enumerate(results) if isinstance(result, NoScriptError)]
        if missing:
            first, *rest = missing
            results[first] = script.call(*calls[first])
            redone = self._eval_pipelined(script, [calls[i] for i in rest])
            for i, result in zip(rest, redone, strict=True):
                results[i] = result
        for result in results:
            if isinstance(result, Exception):
                raise result
        return results


class Lock:
    """A lock with an owner token: only the holder can renew or release it.

    It narrows duplicate work (overlapping fanout runs); correctness never rests on it alone.
    """

    def __init__(self, client: RedisPort, key: str, ttl_ms: int) -> None:
        self._client = client
        self.key = key
        self.ttl_ms = ttl_ms
        self._renew = client.register_script(LOCK_RENEW_LUA)
        self._release = client.register_script(LOCK_RELEASE_LUA)

    def acquire(self, token: str) -> bool:
        return bool(self._client.set(self.key, token, nx=True, px=self.ttl_ms))

    def renew(self, token: str) -> bool:
        return bool(self._renew([self.key], [token, self.ttl_ms]))

    def release(self, token: str) -> bool:
        return bool(self._release([self.key], [token]))

"""Redis: the index of what is due soon, in buckets, with the scripts that keep it consistent.

Redis is only an index (DynamoDB is the truth): every operation is safe to repeat, and what
Redis loses the migrator rebuilds. Per bucket ``b`` the keys share the hash tag ``{b<b>}``, so
every script touches one slot (ElastiCache cluster mode and Serverless reject cross-slot
scripts):

- ``due``    zset  member -> when it may be leased (its due time; later when deferred)
- ``owner``  hash  member -> its lease's id ``<holder's token>/<seq>``, while a trigger holds it
- ``lease``  zset  lease id -> deadline: one entry per lease call, not per member
- ``held``   hash  lease id -> its members (newline-separated), ``<id>#`` -> how many of them
  it still holds (a lease that let go of all is deleted), ``#seq`` -> the last lease id's seq
- ``heads``  hash  timer id -> the timer's current chain member (one live chain per timer)
- ``data``   hash  timer id -> ``"<rev>|<json>"``: the timer as a trigger needs it
- ``done``   zset  finished member -> when (re-adding a fired member is a no-op for a while)
- ``run:<slot>`` string: a trigger run for the bucket is queued or going (owner token)

Members are :class:`timers.core.chain.Member` strings ``tenant|timer|due|rev|n|pv``. The global
``tq:{hints}`` zset maps each bucket to a lower bound of its earliest due member: every adder
lowers it (``ZADD LT``), the fan-out polls it. Scripts are Redis 6.2 Lua run by EVALSHA (with
EVAL on NOSCRIPT); ElastiCache has no Redis 7 ``FUNCTION``.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from redis.exceptions import NoScriptError

from timers.core.chain import Member

HINTS_KEY = "tq:{hints}"
DONE_KEEP_MS = 10 * 60_000
"""Finished members are remembered this long: longer than the migrator needs to see a fired
one-shot's wakeup listing dead (it reads the listings due in its window every minute)."""

ENSURE_CHUNK = 200  # members per script call: bounds how long one call blocks Redis
MISSING, ALIVE, FIRED, SUPERSEDED = 0, 1, 2, 3  # answers of ``alive``

# Lua helpers shared by the scripts: the fields of a member, a zset's first score, and bulk
# commands. Per-member work is string matching in Lua; Redis commands are issued once per call
# with every member as an argument (a command costs far more than an argument), in chunks of
# BULK arguments (Lua's unpack has a stack limit of ~8,000).
_LUA_HELPERS = """
local function tenant_of(m) return string.match(m, '^([^|]*)') end
local function tid_of(m) return string.match(m, '^[^|]*|([^|]*)') end
local function due_of(m) return tonumber(string.match(m, '^[^|]*|[^|]*|([^|]*)')) end
local function rev_of(m) return tonumber(string.match(m, '^[^|]*|[^|]*|[^|]*|([^|]*)')) end
local function alive(due, owner, m)
  return redis.call('ZSCORE', due, m) or redis.call('HEXISTS', owner, m) == 1
end
local function earliest(key)
  local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  if first[2] then return tonumber(first[2]) end
  return -1
end
local function bulk(cmd, key, args)
  local out = {}
  for i = 1, #args, 1000 do
    local got = redis.call(cmd, key, unpack(args, i, math.min(i + 999, #args)))
    if type(got) == 'table' then
      for _, v in ipairs(got) do out[#out + 1] = v end
    end
  end
  return out
end
local function zadd_pairs(key, scored)
  if #scored > 0 then bulk('ZADD', key, scored) end
end
-- The members of ``ms`` that leases of ``holder`` hold: their ownership is dropped and their
-- leases counted down (a lease left with none is deleted). Returns their indexes in ``ms``.
local function let_go(owner_key, lease_key, held_key, ms, holder)
  local holders = bulk('HMGET', owner_key, ms)
  local prefix = holder .. '/'
  local mine, gone, counts, ids, seen = {}, {}, {}, {}, {}
  for i, m in ipairs(ms) do
    local id = holders[i]
    if id and not seen[m] and string.sub(id, 1, #prefix) == prefix then
      seen[m] = true
      mine[#mine + 1] = i
      gone[#gone + 1] = m
      if not counts[id] then counts[id] = 0; ids[#ids + 1] = id end
      counts[id] = counts[id] + 1
    end
  end
  if #gone > 0 then bulk('HDEL', owner_key, gone) end
  for _, id in ipairs(ids) do
    if redis.call('HINCRBY', held_key, id .. '#', -counts[id]) <= 0 then
      redis.call('HDEL', held_key, id, id .. '#')
      redis.call('ZREM', lease_key, id)
    end
  end
  return mine
end
"""

# ensure. KEYS: due, owner, heads, data, done. ARGV: (member, timer id, rev, card|'')...
# Put a member in unless its timer's chain is alive at its revision or newer, or it fired
# recently. A newer revision replaces the old head. Returns {added, earliest added score}.
ENSURE_LUA = (
    _LUA_HELPERS
    + """
local added, first = 0, -1
for i = 1, #ARGV, 4 do
  local m, tid, rev, card = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2]), ARGV[i + 3]
  local head = redis.call('HGET', KEYS[3], tid)
  local head_rev = head and rev_of(head) or -1
  local skip = head_rev > rev
    or (head and head_rev == rev and alive(KEYS[1], KEYS[2], head))
    or redis.call('ZSCORE', KEYS[5], m)
  if not skip then
    if head and head_rev < rev then redis.call('ZREM', KEYS[1], head) end
    local due = due_of(m)
    redis.call('ZADD', KEYS[1], due, m)
    redis.call('HSET', KEYS[3], tid, m)
    if card ~= '' then
      local had = redis.call('HGET', KEYS[4], tid)
      if not had or tonumber(string.match(had, '^(%d+)|')) <= rev then
        redis.call('HSET', KEYS[4], tid, card)
      end
    end
    added = added + 1
    if first < 0 or due < first then first = due end
  end
end
return {added, first}
"""
)

# alive. KEYS: due, owner, heads, done. ARGV: (timer id, rev, member|'')...
# For each: 2 if the member fired recently, 3 if a newer revision owns the timer's chain, 1 if
# its chain is alive at this revision, else 0. The migrator asks before it reads DynamoDB.
# Read-only, so every lookup is one bulk command for the whole call.
ALIVE_LUA = (
    _LUA_HELPERS
    + """
local n = #ARGV / 3
local tids, asked = {}, {}
for i = 1, n do
  tids[i] = ARGV[3 * i - 2]
  local m = ARGV[3 * i]
  asked[i] = m ~= '' and m or '-'
end
local heads = bulk('HMGET', KEYS[3], tids)
local fired = bulk('ZMSCORE', KEYS[4], asked)
local named = {}
for i = 1, n do named[i] = heads[i] or '-' end
local in_due = bulk('ZMSCORE', KEYS[1], named)
local in_lease = bulk('HMGET', KEYS[2], named)
local out = {}
for i = 1, n do
  local rev, head, state = tonumber(ARGV[3 * i - 1]), heads[i], 0
  if ARGV[3 * i] ~= '' and fired[i] then
    state = 2
  elseif head then
    local head_rev = rev_of(head)
    if head_rev > rev then
      state = 3
    elseif head_rev == rev and (in_due[i] or in_lease[i]) then
      state = 1
    end
  end
  out[i] = state
end
return out
"""
)

# lease. KEYS: due, lease, owner, data, held.
# ARGV: now, until, deadline, limit, owner, scan.
# Expired leases give what they still hold back to due. Then up to ``limit`` members with score
# <= until are leased (one lease: an id, a deadline, the list), taken round-robin across
# tenants among the first ``scan`` candidates. Returns {members, cards of their timers,
# reclaimed, next due score or -1}.
LEASE_LUA = (
    _LUA_HELPERS
    + """
local reclaimed = 0
local expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', ARGV[1])
if #expired > 0 then
  local lists = bulk('HMGET', KEYS[5], expired)
  local ms, ids, fields = {}, {}, {}
  for i, id in ipairs(expired) do
    for m in string.gmatch(lists[i] or '', '[^\\n]+') do ms[#ms + 1] = m; ids[#ids + 1] = id end
    fields[#fields + 1] = id; fields[#fields + 1] = id .. '#'
  end
  if #ms > 0 then
    local holders = bulk('HMGET', KEYS[3], ms)
    local gone, back = {}, {}
    for i, m in ipairs(ms) do
      if holders[i] == ids[i] then
        gone[#gone + 1] = m; back[#back + 1] = due_of(m); back[#back + 1] = m
      end
    end
    if #gone > 0 then bulk('HDEL', KEYS[3], gone); zadd_pairs(KEYS[1], back) end
    reclaimed = #gone
  end
  bulk('HDEL', KEYS[5], fields)
  bulk('ZREM', KEYS[2], expired)
end
local limit = tonumber(ARGV[4])
local candidates = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[2], 'LIMIT', 0, ARGV[6])
local taken = candidates
if #candidates > limit then
  local queues, order = {}, {}
  for _, m in ipairs(candidates) do
    local tenant = tenant_of(m)
    if not queues[tenant] then queues[tenant] = {}; order[#order + 1] = tenant end
    table.insert(queues[tenant], m)
  end
  taken = {}
  local round = 1
  while #taken < limit do
    local any = false
    for _, tenant in ipairs(order) do
      local m = queues[tenant][round]
      if m and #taken < limit then taken[#taken + 1] = m; any = true end
    end
    if not any then break end
    round = round + 1
  end
end
local cards = {}
if #taken > 0 then
  local id = ARGV[5] .. '/' .. redis.call('HINCRBY', KEYS[5], '#seq', 1)
  local owned, tids = {}, {}
  for i, m in ipairs(taken) do
    owned[2 * i - 1] = m; owned[2 * i] = id
    tids[i] = tid_of(m)
  end
  bulk('ZREM', KEYS[1], taken)
  bulk('HSET', KEYS[3], owned)
  redis.call('HSET', KEYS[5], id, table.concat(taken, '\\n'), id .. '#', #taken)
  redis.call('ZADD', KEYS[2], ARGV[3], id)
  local got = bulk('HMGET', KEYS[4], tids)
  for i = 1, #taken do cards[i] = got[i] or '' end
end
return {taken, cards, reclaimed, earliest(KEYS[1])}
"""
)

# finish. KEYS: due, lease, owner, heads, data, done, held.
# ARGV: owner, now, keep_ms, (member, next member|'')...
# Forget each member this owner holds and remember it in done; where the member is still its
# timer's head, chain the next member (or, with none, drop the timer's head and card). The
# members are taken in order against a local copy of the heads, then written in bulk: done is
# written first, so a next member that is finished in the same call is not put back.
# Returns the earliest due score or -1.
FINISH_LUA = (
    _LUA_HELPERS
    + """
local ms, tids = {}, {}
for i = 4, #ARGV, 2 do ms[#ms + 1] = ARGV[i]; tids[#tids + 1] = tid_of(ARGV[i]) end
let_go(KEYS[3], KEYS[2], KEYS[7], ms, ARGV[1])
local finished = {}
for i, m in ipairs(ms) do finished[2 * i - 1] = ARGV[2]; finished[2 * i] = m end
bulk('ZREM', KEYS[1], ms)
zadd_pairs(KEYS[6], finished)
local heads, touched, order = {}, {}, {}
local got = bulk('HMGET', KEYS[4], tids)
for i, tid in ipairs(tids) do
  if heads[tid] == nil then heads[tid] = got[i] end
end
local chained = {}
for i, m in ipairs(ms) do
  local tid, nxt = tids[i], ARGV[3 + 2 * i]
  if heads[tid] == m then
    if not touched[tid] then touched[tid] = true; order[#order + 1] = tid end
    if nxt ~= '' then
      heads[tid] = nxt
      chained[#chained + 1] = nxt
    else
      heads[tid] = false
    end
  end
end
if #chained > 0 then
  local seen = bulk('ZMSCORE', KEYS[6], chained)
  local back = {}
  for i, nxt in ipairs(chained) do
    if not seen[i] then back[#back + 1] = due_of(nxt); back[#back + 1] = nxt end
  end
  zadd_pairs(KEYS[1], back)
end
local set, gone = {}, {}
for _, tid in ipairs(order) do
  if heads[tid] then set[#set + 1] = tid; set[#set + 1] = heads[tid]
  else gone[#gone + 1] = tid end
end
if #set > 0 then bulk('HSET', KEYS[4], set) end
if #gone > 0 then
  bulk('HDEL', KEYS[4], gone)
  bulk('HDEL', KEYS[5], gone)
end
redis.call('ZREMRANGEBYSCORE', KEYS[6], '-inf', tonumber(ARGV[2]) - tonumber(ARGV[3]))
return earliest(KEYS[1])
"""
)

# release. KEYS: due, lease, owner, held. ARGV: owner, (member, score)...
# Give members this owner holds back to due, leasable from ``score`` (its due time, or later
# to wait for another run's claim to lapse). Returns how many.
RELEASE_LUA = (
    _LUA_HELPERS
    + """
local ms = {}
for i = 2, #ARGV, 2 do ms[#ms + 1] = ARGV[i] end
local back = {}
for _, i in ipairs(let_go(KEYS[3], KEYS[2], KEYS[4], ms, ARGV[1])) do
  back[#back + 1] = ARGV[2 * i + 1]; back[#back + 1] = ms[i]
end
zadd_pairs(KEYS[1], back)
return #back / 2
"""
)

# replace. KEYS: due, heads, data. ARGV: timer id, rev, member|'', card|''.
# A change of the timer (api): drop its old head from due and put the new member in, unless a
# newer revision is already there. Returns 1 if applied.
REPLACE_LUA = (
    _LUA_HELPERS
    + """
local head = redis.call('HGET', KEYS[2], ARGV[1])
if head and rev_of(head) > tonumber(ARGV[2]) then return 0 end
if head then redis.call('ZREM', KEYS[1], head) end
if ARGV[3] ~= '' then
  redis.call('ZADD', KEYS[1], due_of(ARGV[3]), ARGV[3])
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
  redis.call('HSET', KEYS[3], ARGV[1], ARGV[4])
else
  redis.call('HDEL', KEYS[2], ARGV[1])
  redis.call('HDEL', KEYS[3], ARGV[1])
end
return 1
"""
)

# recard. KEYS: data. ARGV: timer id, rev, card.
# A change adopted by a claimed fire (docs/fire-path.md, R5): only the timer's card moves on (if
# newer); its head stays, and chains the change's revision when the fire is recorded.
RECARD_LUA = """
local had = redis.call('HGET', KEYS[1], ARGV[1])
if had and tonumber(string.match(had, '^(%d+)|')) > tonumber(ARGV[2]) then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
return 1
"""

# take hint. KEYS: hints. ARGV: bucket, score. Remove the hint only if nobody lowered it since.
TAKE_HINT_LUA = """
if redis.call('ZSCORE', KEYS[1], ARGV[1]) == ARGV[2] then
  return redis.call('ZREM', KEYS[1], ARGV[1])
end
return 0
"""

# Token-guarded string keys (locks, run markers). KEYS: key. ARGV: token[, ttl_ms].
RENEW_LUA = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""
DELETE_LUA = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


class ScriptPort(Protocol):
    """A registered script (redis-py ``Script``): EVALSHA, loading the script on NOSCRIPT."""

    def __call__(self, keys: Sequence[str], args: Sequence[str | int]) -> Any: ...


class PipelinePort(Protocol):
    def execute_command(self, *args: str | int) -> Any: ...
    def execute(self, raise_on_error: bool = True) -> list[Any]: ...


class RedisPort(Protocol):
    """The Redis commands used; ``redis.Redis`` and ``redis.RedisCluster`` fit."""

    def register_script(self, script: str) -> ScriptPort: ...
    def pipeline(self, transaction: bool = True) -> PipelinePort: ...
    def set(self, name: str, value: str, *, px: int | None = None, nx: bool = False) -> Any: ...
    def execute_command(self, *args: str | int) -> Any: ...


class Script:
    """A script registered once, plus its SHA1, which pipelined EVALSHA needs."""

    def __init__(self, client: RedisPort, text: str) -> None:
        self.call = client.register_script(text)
        self.sha = hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()


class BucketKeys(NamedTuple):
    due: str
    lease: str
    owner: str
    heads: str
    data: str
    done: str
    held: str

    @classmethod
    def of(cls, prefix: str, bucket: int) -> BucketKeys:
        base = f"{prefix}:{{b{bucket}}}"
        return cls(*(f"{base}:{name}" for name in cls._fields))


@dataclass(frozen=True)
class Leased:
    """What one lease call took: the members, the cards of their timers (None where Redis has
    none), how many expired leases it put back first, and the bucket's next due score."""

    members: list[Member]
    cards: dict[str, str | None]
    reclaimed: int
    next_due: int | None


Placement = tuple[int, Member, str | None]  # (partition, member, card or None)
Call = tuple[list[str], list[str | int]]


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _score(value: Any) -> int | None:
    return None if value is None or int(value) < 0 else int(value)


class RedisIndex:
    """Due positions in ``bucket_count`` buckets, leased atomically by triggers."""

    def __init__(self, client: RedisPort, bucket_count: int, prefix: str = "tq") -> None:
        if bucket_count < 1:
            raise ValueError("bucket_count must be >= 1")
        self._client = client
        self.bucket_count = bucket_count
        self.prefix = prefix
        self._ensure = Script(client, ENSURE_LUA)
        self._alive = Script(client, ALIVE_LUA)
        self._lease = Script(client, LEASE_LUA)
        self._finish = Script(client, FINISH_LUA)
        self._release = Script(client, RELEASE_LUA)
        self._replace = Script(client, REPLACE_LUA)
        self._recard = Script(client, RECARD_LUA)
        self._take_hint = Script(client, TAKE_HINT_LUA)
        self._renew = Script(client, RENEW_LUA)
        self._delete = Script(client, DELETE_LUA)

    def keys(self, bucket: int) -> BucketKeys:
        if not 0 <= bucket < self.bucket_count:
            raise ValueError(f"bucket {bucket} outside 0..{self.bucket_count - 1}")
        return BucketKeys.of(self.prefix, bucket)

    def run_key(self, bucket: int, slot: int) -> str:
        self.keys(bucket)
        return f"{self.prefix}:{{b{bucket}}}:run:{slot}"

    # ---------------------------------------------------------------- adding

    def bucket_of(self, partition: int) -> int:
        """The Redis bucket of a claim partition (timers.core.chain.PARTITIONS)."""
        return partition % self.bucket_count

    # The per-timer operations below take a timer's *partition*; the per-bucket ones (lease,
    # finish, release, hints, markers) a Redis bucket.

    def ensure(self, placements: Iterable[Placement]) -> int:
        """Put members in unless their timer's chain is alive or they fired recently; a newer
        revision replaces an older one. Hints follow. Returns how many were added."""
        calls: list[Call] = []
        buckets: list[int] = []
        for bucket, group in _grouped(placements, self.bucket_of).items():
            k = self.keys(bucket)
            for start in range(0, len(group), ENSURE_CHUNK):
                args: list[str | int] = []
                for member, card in group[start : start + ENSURE_CHUNK]:
                    args += [str(member), member.timer_id, member.rev, card or ""]
                calls.append(([k.due, k.owner, k.heads, k.data, k.done], args))
                buckets.append(bucket)
        results = self._eval(self._ensure, calls, hints=True, buckets=buckets)
        return sum(int(added) for added, _ in results)

    def alive(self, checks: Iterable[tuple[int, str, int, Member | None]]) -> list[int]:
        """For each (partition, timer id, rev, member or None), in input order: FIRED if the
        member fired recently, SUPERSEDED if a newer revision owns the timer's chain, ALIVE if
        it is alive at this revision, else MISSING."""
        items = list(checks)
        by_bucket: dict[int, list[int]] = defaultdict(list)
        for i, (partition, _, _, _) in enumerate(items):
            by_bucket[self.bucket_of(partition)].append(i)
        calls: list[Call] = []
        order: list[int] = []
        for bucket, indexes in by_bucket.items():
            k = self.keys(bucket)
            for start in range(0, len(indexes), ENSURE_CHUNK):
                chunk = indexes[start : start + ENSURE_CHUNK]
                args: list[str | int] = []
                for i in chunk:
                    _, timer_id, rev, member = items[i]
                    args += [timer_id, rev, "" if member is None else str(member)]
                calls.append(([k.due, k.owner, k.heads, k.done], args))
                order += chunk
        answers = [int(a) for result in self._eval(self._alive, calls) for a in result]
        out = [MISSING] * len(items)
        for i, answer in zip(order, answers, strict=True):
            out[i] = answer
        return out

    def replace(
        self, partition: int, timer_id: str, rev: int, member: Member | None, card: str | None
    ) -> bool:
        """A change of the timer: its old head leaves ``due``, ``member`` (if any) comes in."""
        bucket = self.bucket_of(partition)
        k = self.keys(bucket)
        call: Call = (
            [k.due, k.heads, k.data],
            [timer_id, rev, "" if member is None else str(member), card or ""],
        )
        (applied,) = self._eval(self._replace, [call])
        if member is not None:
            self.hint(bucket, member.due)
        return bool(applied)

    def recard(self, partition: int, timer_id: str, rev: int, card: str) -> bool:
        """A change adopted by a claimed fire: the timer's card moves on, its head stays."""
        k = self.keys(self.bucket_of(partition))
        (applied,) = self._eval(self._recard, [([k.data], [timer_id, rev, card])])
        return bool(applied)

    # ---------------------------------------------------------------- the trigger's side

    def lease(
        self,
        bucket: int,
        *,
        now_ms: int,
        until_ms: int,
        deadline_ms: int,
        limit: int,
        owner: str,
        scan: int | None = None,
    ) -> Leased:
        """Reclaim expired leases, then lease up to ``limit`` members leasable by ``until_ms``
        (round-robin across tenants). Concurrent callers get disjoint members."""
        if limit < 0 or deadline_ms <= now_ms:
            raise ValueError("limit must be >= 0 and the deadline after now")
        k = self.keys(bucket)
        taken, cards, reclaimed, next_due = self._lease.call(
            [k.due, k.lease, k.owner, k.data, k.held],
            [now_ms, until_ms, deadline_ms, limit, owner, scan or 4 * max(1, limit)],
        )
        members = [Member.parse(_text(m)) for m in taken]
        return Leased(
            members,
            {m.timer_id: (_text(c) or None) for m, c in zip(members, cards, strict=True)},
            int(reclaimed),
            _score(next_due),
        )

    def finish(
        self, bucket: int, owner: str, now_ms: int, done: Sequence[tuple[Member, Member | None]]
    ) -> int | None:
        """Forget finished members and chain their next (None: the chain leaves Redis).
        Returns the bucket's earliest due score, which the caller hints."""
        if not done:
            return None
        k = self.keys(bucket)
        args: list[str | int] = [owner, now_ms, DONE_KEEP_MS]
        for member, following in done:
            args += [str(member), "" if following is None else str(following)]
        (earliest,) = self._eval(
            self._finish, [([k.due, k.lease, k.owner, k.heads, k.data, k.done, k.held], args)]
        )
        return _score(earliest)

    def release(self, bucket: int, owner: str, members: Mapping[Member, int]) -> int:
        """Give members back to due, each leasable from its score (its due time, or later)."""
        if not members:
            return 0
        k = self.keys(bucket)
        args: list[str | int] = [owner]
        for member, score in members.items():
            args += [str(member), score]
        (count,) = self._eval(self._release, [([k.due, k.lease, k.owner, k.held], args)])
        self.hint(bucket, min(members.values()))
        return int(count)

    # ---------------------------------------------------------------- dispatch

    def hint(self, bucket: int, due_ms: int) -> None:
        """Lower the bucket's hint to ``due_ms`` (never raises it)."""
        self._client.execute_command("ZADD", HINTS_KEY, "LT", due_ms, bucket)

    def hints_until(self, until_ms: int, limit: int = 10_000) -> list[tuple[int, int]]:
        """(bucket, hint) of every bucket with something leasable by ``until_ms``."""
        got = self._client.execute_command(
            "ZRANGEBYSCORE", HINTS_KEY, "-inf", until_ms, "WITHSCORES", "LIMIT", 0, limit
        )
        pairs = [(int(_text(b)), int(float(s))) for b, s in _pairs(got)]
        # a bucket beyond the count (the count was lowered) is nobody's: never poll it again
        return [(b, s) for b, s in pairs if 0 <= b < self.bucket_count]

    def take_hint(self, bucket: int, hint_ms: int) -> bool:
        """Remove the hint if it still says ``hint_ms`` (a member added since keeps it)."""
        return bool(self._take_hint.call([HINTS_KEY], [bucket, hint_ms]))

    def backlog(self, buckets: Sequence[int], until_ms: int, now_ms: int) -> dict[int, int]:
        """Per bucket: members leasable by ``until_ms`` plus leases expired by ``now_ms``."""
        pipe = self._client.pipeline(transaction=False)
        for bucket in buckets:
            k = self.keys(bucket)
            pipe.execute_command("ZCOUNT", k.due, "-inf", until_ms)
            pipe.execute_command("ZCOUNT", k.lease, "-inf", now_ms)
        counts = pipe.execute()
        return {b: int(counts[2 * i]) + int(counts[2 * i + 1]) for i, b in enumerate(buckets)}

    def sweep(self) -> dict[int, int]:
        """The backstop: every bucket's earliest due member or lease deadline, hinted.
        Returns what it found (one pipelined round trip, plus one for the hints)."""
        pipe = self._client.pipeline(transaction=False)
        for bucket in range(self.bucket_count):
            k = self.keys(bucket)
            pipe.execute_command("ZRANGE", k.due, 0, 0, "WITHSCORES")
            pipe.execute_command("ZRANGE", k.lease, 0, 0, "WITHSCORES")
        answers = pipe.execute()
        found: dict[int, int] = {}
        for bucket in range(self.bucket_count):
            scores = [int(float(s)) for answer in answers[2 * bucket : 2 * bucket + 2]
                      for _, s in _pairs(answer)]  # fmt: skip
            if scores:
                found[bucket] = min(scores)
        if found:
            hints = self._client.pipeline(transaction=False)
            for bucket, due in found.items():
                hints.execute_command("ZADD", HINTS_KEY, "LT", due, bucket)
            hints.execute()
        return found

    def rehint(self, bucket: int) -> int | None:
        """Hint the bucket from its earliest due member or lease deadline; returns it."""
        k = self.keys(bucket)
        pipe = self._client.pipeline(transaction=False)
        pipe.execute_command("ZRANGE", k.due, 0, 0, "WITHSCORES")
        pipe.execute_command("ZRANGE", k.lease, 0, 0, "WITHSCORES")
        scores = [int(float(s)) for answer in pipe.execute() for _, s in _pairs(answer)]
        if not scores:
            return None
        self.hint(bucket, min(scores))
        return min(scores)

    def start_run(self, bucket: int, slot: int, token: str, ttl_ms: int) -> bool:
        """Mark a run of the bucket as started (queued), unless one is marked already."""
        return bool(self._client.set(self.run_key(bucket, slot), token, nx=True, px=ttl_ms))

    def touch_run(self, bucket: int, slot: int, token: str, ttl_ms: int) -> bool:
        return bool(self._renew.call([self.run_key(bucket, slot)], [token, ttl_ms]))

    def end_run(self, bucket: int, slot: int, token: str) -> bool:
        return bool(self._delete.call([self.run_key(bucket, slot)], [token]))

    # ---------------------------------------------------------------- inspection

    def members(self, bucket: int) -> tuple[list[Member], list[Member]]:
        """(due, leased) members of the bucket, for tests and operators."""
        k = self.keys(bucket)
        pipe = self._client.pipeline(transaction=False)
        pipe.execute_command("ZRANGE", k.due, 0, -1)
        pipe.execute_command("HKEYS", k.owner)
        due, leased = pipe.execute()
        held = sorted(_text(m) for m in leased)
        return [Member.parse(_text(m)) for m in due], [Member.parse(m) for m in held]

    # ---------------------------------------------------------------- plumbing

    def _eval(
        self,
        script: Script,
        calls: Sequence[Call],
        *,
        hints: bool = False,
        buckets: Sequence[int] = (),
    ) -> list[Any]:
        """EVALSHA every call in one round trip, then (``hints``) lower the hints of the
        buckets whose script returned an earliest added score.

        redis-py's pipeline script support costs a SCRIPT EXISTS round trip per execute and its
        cluster pipeline has none; after a SCRIPT FLUSH or failover the calls meet NOSCRIPT:
        the first is redone through the registered script, which loads it, the rest again.
        """
        if not calls:
            return []
        pipe = self._client.pipeline(transaction=False)
        for keys, args in calls:
            pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
        results = pipe.execute(raise_on_error=False)
        missing = [i for i, result in enumerate(results) if isinstance(result, NoScriptError)]
        if missing:
            first, *rest = missing
            results[first] = script.call(*calls[first])
            for i, result in zip(rest, self._eval(script, [calls[i] for i in rest]), strict=True):
                results[i] = result
        for result in results:
            if isinstance(result, Exception):
                raise result
        if hints:
            lowest: dict[int, int] = {}
            for bucket, result in zip(buckets, results, strict=True):
                due = _score(result[1]) if isinstance(result, list) else None
                if due is not None:
                    lowest[bucket] = min(due, lowest.get(bucket, due))
            if lowest:
                pipe = self._client.pipeline(transaction=False)
                for bucket, due in lowest.items():
                    pipe.execute_command("ZADD", HINTS_KEY, "LT", due, bucket)
                pipe.execute()
        return results


def _grouped(
    placements: Iterable[Placement], bucket_of: Callable[[int], int]
) -> dict[int, list[tuple[Member, str | None]]]:
    grouped: dict[int, list[tuple[Member, str | None]]] = defaultdict(list)
    for partition, member, card in placements:
        grouped[bucket_of(partition)].append((member, card))
    return grouped


def _pairs(flat: Any) -> list[tuple[Any, Any]]:
    """redis-py returns WITHSCORES replies as pairs through ``zrange`` but flat through
    ``execute_command``; accept both."""
    if flat and isinstance(flat[0], list | tuple):
        return [(a, b) for a, b in flat]
    return list(zip(flat[::2], flat[1::2], strict=True))


class Lock:
    """A lock with an owner token: only the holder renews or releases it. It narrows duplicate
    work (overlapping fan-out runs); correctness never rests on it alone."""

    def __init__(self, client: RedisPort, key: str, ttl_ms: int) -> None:
        self._client = client
        self.key = key
        self.ttl_ms = ttl_ms
        self._renew = client.register_script(RENEW_LUA)
        self._delete = client.register_script(DELETE_LUA)

    def acquire(self, token: str) -> bool:
        return bool(self._client.set(self.key, token, nx=True, px=self.ttl_ms))

    def renew(self, token: str) -> bool:
        return bool(self._renew([self.key], [token, self.ttl_ms]))

    def release(self, token: str) -> bool:
        return bool(self._delete([self.key], [token]))

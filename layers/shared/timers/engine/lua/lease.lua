-- Lease what may be leased by `until`: members due, and members whose lease ended (their run
-- is gone). A lease is a later score: the member stays in `due`, leasable again at `lease_end`
-- unless its run settles it first. A member without a card is dropped (nothing to fire).
-- KEYS: due, data, tags, tails. ARGV: until, lease_end, limit, scan (the look), admit.
-- Returns {members, their cards, the earliest score left or -1}.
--
-- Fair across tenants whatever the sizes and names (docs/fire-path.md, "Fairness"). While
-- everything leasable fits in one look (`scan` candidates) and nothing is queued, the lease
-- takes those round-robin across tenants. Otherwise it queues what is due by time - up to
-- `admit` members a call, oldest first - at fair places: start-time fair queuing, each member
-- re-scored to its tag S = max(V, the tenant's last tag + 1), V being the queue head's tag;
-- queued scores (below TIMED) come before every time, so the lease takes the lowest tags:
-- one member of each tenant with work per round, however many another tenant queued first.
-- The tenants' last tags (`tags`) and the members queued at them (`tails`) live as long as
-- the queue. A tenant whose last queued member left the queue by a change (a delete, a PATCH,
-- a pause: it is no longer at its tag) re-enters at V, as a newcomer: it never waits behind
-- members it no longer has.
local due, data, tags, tails = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local upto, lease_end, limit = ARGV[1], ARGV[2], tonumber(ARGV[3])
local TIMED = 1000000000000  -- scores from here on are times (epoch ms); below: queue tags

local function tenant_of(m) return string.match(m, '^([^|]*)') end

-- Round-robin across tenants: the first member of each tenant, then the second, ...
local function round_robin(candidates)
  local queues, order, taken = {}, {}, {}
  for i = 1, #candidates, 2 do
    local m = candidates[i]
    local tenant = tenant_of(m)
    if not queues[tenant] then queues[tenant] = {}; order[#order + 1] = tenant end
    table.insert(queues[tenant], m)
  end
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
  return taken
end

-- The members of a read WITHSCORES, and the score after the `limit`-th if there is one.
local function first_of(read)
  local out = {}
  for i = 1, math.min(#read, 2 * limit), 2 do out[#out + 1] = read[i] end
  return out, read[2 * limit + 2]
end

-- Queue the arrivals (members due by time: up to `admit`, oldest first), each at its tenant's
-- next tag after V; then the lowest `limit` tags are taken. `queue` is what a read of the
-- lowest scores found (tags first); returns the members taken and, if more is queued, the
-- next tag (the earliest score left).
local function fair_lease(v, queue)
  local arrivals = redis.call('ZRANGEBYSCORE', due, TIMED, upto, 'LIMIT', 0, ARGV[5])
  if #arrivals > 0 then
    local names, last = {}, {}
    for _, m in ipairs(arrivals) do
      local tenant = tenant_of(m)
      if not last[tenant] then last[tenant] = -1; names[#names + 1] = tenant end
    end
    -- a last tag ahead of the head counts only while the tenant's member is still queued at
    -- it (a leased one's tag is never ahead of the head: leases take the lowest tags)
    local owners = {}
    for i, s in ipairs(redis.call('ZMSCORE', tags, unpack(names))) do
      if s then
        last[names[i]] = tonumber(s)
        if tonumber(s) > v then owners[#owners + 1] = names[i] end
      end
    end
    if #owners > 0 then
      local ahead, whose = {}, {}
      for i, m in ipairs(redis.call('HMGET', tails, unpack(owners))) do
        if m then ahead[#ahead + 1] = m; whose[#whose + 1] = owners[i] end
      end
      if #ahead > 0 then
        for i, s in ipairs(redis.call('ZMSCORE', due, unpack(ahead))) do
          if not s or tonumber(s) ~= last[whose[i]] + 1 then last[whose[i]] = -1 end
        end
      end
    end
    local rescored, lasts, tailed, tail = {}, {}, {}, {}
    for _, m in ipairs(arrivals) do
      local tenant = tenant_of(m)
      local tag = math.max(v, last[tenant] + 1)
      last[tenant] = tag
      tail[tenant] = m
      rescored[#rescored + 1] = tag + 1  -- scores from 1
      rescored[#rescored + 1] = m
    end
    for _, tenant in ipairs(names) do
      lasts[#lasts + 1] = last[tenant]
      lasts[#lasts + 1] = tenant
      tailed[#tailed + 1] = tenant
      tailed[#tailed + 1] = tail[tenant]
    end
    bulk('ZADD', due, rescored)
    bulk('ZADD', tags, lasts)
    bulk('HSET', tails, tailed)
    queue = redis.call('ZRANGEBYSCORE', due, '-inf', '(' .. TIMED, 'WITHSCORES', 'LIMIT', 0, limit + 1)
  end
  local taken, next_tag = first_of(queue)
  if next_tag then return taken, next_tag end
  redis.call('DEL', tags, tails)  -- the queue empties with this lease: the next starts afresh
  return taken, nil
end

local taken, first
-- the lowest scores leasable: a queue's head (tags), or what is due by time
local lowest = redis.call('ZRANGEBYSCORE', due, '-inf', upto, 'WITHSCORES', 'LIMIT', 0, limit + 1)
if #lowest > 0 and tonumber(lowest[2]) < TIMED then
  taken, first = fair_lease(tonumber(lowest[2]) - 1, lowest)  -- a queue: V is its head's tag
elseif #lowest <= 2 * limit then
  taken = first_of(lowest)  -- no more leasable than a lease takes: all of it, in due order
else
  local window = tonumber(ARGV[4])
  local candidates = redis.call('ZRANGEBYSCORE', due, '-inf', upto, 'WITHSCORES', 'LIMIT', 0, window)
  if #candidates < 2 * window then
    taken = round_robin(candidates)  -- everything leasable is in view
  else  -- more may be hidden behind these: queue them fairly, in a new queue
    redis.call('DEL', tags, tails)  -- (tags left by a queue that changes emptied are stale)
    taken, first = fair_lease(0, {})
  end
end
local members, cards, gone, scored = {}, {}, {}, {}
if #taken > 0 then
  local got = bulk('HMGET', data, taken)
  for i, m in ipairs(taken) do
    if got[i] then
      members[#members + 1] = m
      cards[#cards + 1] = got[i]
      scored[#scored + 1] = lease_end
      scored[#scored + 1] = m
    else
      gone[#gone + 1] = m
    end
  end
  if #gone > 0 then bulk('ZREM', due, gone) end
  if #scored > 0 then bulk('ZADD', due, scored) end
end
if not first then
  -- the earliest member's score (ended-chain notes, from NOTED = 1e13 on, are no members)
  local left = redis.call('ZRANGEBYSCORE', due, '-inf', '(10000000000000', 'LIMIT', 0, 1, 'WITHSCORES')
  first = left[2] or '-1'
end
return {members, cards, first}

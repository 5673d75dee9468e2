-- Lease what may be leased by `until`: members due, and members whose lease ended (their run
-- is gone). A lease is a later score: the member stays in `due`, leasable again at `lease_end`
-- unless its run settles it first. Up to `limit` members, round-robin across tenants among the
-- first `scan` candidates. A member without a card is dropped (nothing to fire).
-- KEYS: due, data. ARGV: until, lease_end, limit, scan.
-- Returns {members, their cards, the earliest score left or -1}.
local due, data = KEYS[1], KEYS[2]
local limit = tonumber(ARGV[3])
local candidates = redis.call('ZRANGEBYSCORE', due, '-inf', ARGV[1], 'LIMIT', 0, ARGV[4])
local taken = candidates
if #candidates > limit then
  local queues, order = {}, {}
  for _, m in ipairs(candidates) do
    local tenant = string.match(m, '^([^|]*)')
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
local members, cards, gone, scored = {}, {}, {}, {}
if #taken > 0 then
  local got = bulk('HMGET', data, taken)
  for i, m in ipairs(taken) do
    if got[i] then
      members[#members + 1] = m
      cards[#cards + 1] = got[i]
      scored[#scored + 1] = ARGV[2]
      scored[#scored + 1] = m
    else
      gone[#gone + 1] = m
    end
  end
  if #gone > 0 then bulk('ZREM', due, gone) end
  if #scored > 0 then bulk('ZADD', due, scored) end
end
-- the earliest member's score (ended-chain notes, from NOTED = 1e13 on, are no members)
local first = redis.call('ZRANGEBYSCORE', due, '-inf', '(10000000000000', 'LIMIT', 0, 1, 'WITHSCORES')
return {members, cards, first[2] or '-1'}

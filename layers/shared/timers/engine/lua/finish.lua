-- Settle leased members, each only if its card is still at the position the run leased (a
-- change or a restore since owns it) and, with rev >= 0, of no newer revision than rev.
-- KEYS: due, data. ARGV: (member, pos, rev, card, score)... ; card '' drops the member, '!'
-- drops it and notes `member|rev` (its chain ended) at score (>= NOTED), '=' keeps its card and
-- makes it leasable from score (a deferral, a hand-back), anything else is the next card (the
-- chain moves on), leasable from score. Returns the earliest score or -1.
local due, data = KEYS[1], KEYS[2]
for i = 1, #ARGV, 5 do
  local member, pos, rev = ARGV[i], tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])
  local card, score = ARGV[i + 3], ARGV[i + 4]
  local current = redis.call('HGET', data, member)
  if current then
    local r, p = string.match(current, '^(%d+)|(%d+)|')
    if tonumber(p) == pos and (rev < 0 or tonumber(r) <= rev) then
      if card == '' or card == '!' then
        redis.call('HDEL', data, member)
        redis.call('ZREM', due, member)
        if card == '!' then redis.call('ZADD', due, score, member .. '|' .. ARGV[i + 2]) end
      else
        if card ~= '=' then redis.call('HSET', data, member, card) end
        redis.call('ZADD', due, score, member)
      end
    end
  end
end
-- the earliest member's score (ended-chain notes, from NOTED = 1e13 on, are no members)
local first = redis.call('ZRANGEBYSCORE', due, '-inf', '(10000000000000', 'LIMIT', 0, 1, 'WITHSCORES')
return first[2] or '-1'

-- Settle leased members, each only if its card is still at the position the run leased (a
-- change or a restore since owns it) and, with rev >= 0, of no newer revision than rev.
-- KEYS: due, data. ARGV: (member, pos, rev, card, score)... ; card '' drops the member, '!'
-- drops it and notes `member|rev` (its chain ended) at score (>= NOTED), '=' keeps its card and
-- makes it leasable from score (a deferral, a hand-back), anything else is the next card (the
-- chain moves on), leasable from score. A few commands a call, whatever its size. Returns the
-- earliest score or -1.
local due, data = KEYS[1], KEYS[2]
local members = {}
for i = 1, #ARGV, 5 do members[#members + 1] = ARGV[i] end
local got = bulk('HMGET', data, members)
local sets, scores, drops = {}, {}, {}
for k, member in ipairs(members) do
  local i = 5 * k - 4
  local pos, rev, card, score = tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2]), ARGV[i + 3], ARGV[i + 4]
  if got[k] then
    local r, p = string.match(got[k], '^(%d+)|(%d+)|')
    if tonumber(p) == pos and (rev < 0 or tonumber(r) <= rev) then
      if card == '' or card == '!' then
        drops[#drops + 1] = member
        if card == '!' then
          scores[#scores + 1] = score
          scores[#scores + 1] = member .. '|' .. ARGV[i + 2]
        end
      else
        if card ~= '=' then
          sets[#sets + 1] = member
          sets[#sets + 1] = card
        end
        scores[#scores + 1] = score
        scores[#scores + 1] = member
      end
    end
  end
end
apply(due, data, drops, sets, scores)
-- the earliest member's score (ended-chain notes, from NOTED = 1e13 on, are no members)
local first = redis.call('ZRANGEBYSCORE', due, '-inf', '(10000000000000', 'LIMIT', 0, 1, 'WITHSCORES')
return first[2] or '-1'

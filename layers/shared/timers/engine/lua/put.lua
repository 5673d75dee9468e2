-- Store cards where they are newer: a later revision, or a later position of the same one.
-- KEYS: due, data. ARGV: (member, rev, pos, card, score)... ; card '' removes the member
-- unless a revision no older than rev is stored; score '' keeps a stored member's score (a
-- change adopted by a claimed fire: its run keeps the lease). Returns {stored, earliest
-- score set or -1}.
local due, data = KEYS[1], KEYS[2]
local stored, first = 0, -1
for i = 1, #ARGV, 5 do
  local member, rev, pos = ARGV[i], tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])
  local card, score = ARGV[i + 3], tonumber(ARGV[i + 4])
  local keep = ARGV[i + 4] == ''
  if keep then score = pos end
  local current = redis.call('HGET', data, member)
  local crev, cpos = -1, -1
  if current then
    local r, p = string.match(current, '^(%d+)|(%d+)|')
    crev, cpos = tonumber(r), tonumber(p)
  end
  if card == '' then
    if current and crev < rev then
      redis.call('HDEL', data, member)
      redis.call('ZREM', due, member)
    end
  elseif rev > crev or (rev == crev and pos > cpos) then
    redis.call('HSET', data, member, card)
    if not (keep and redis.call('ZSCORE', due, member)) then
      redis.call('ZADD', due, score, member)
      if first < 0 or score < first then first = score end
    end
    stored = stored + 1
  end
end
return {stored, first}

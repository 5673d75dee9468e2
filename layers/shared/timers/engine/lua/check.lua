-- Each member's card revision and checkpoint; where it has no card, (rev, ENDED) if the asked
-- revision's chain ended, else (-1, -1) (read-only: the migrator asks before it reads
-- DynamoDB). KEYS: data, due. ARGV: (member, rev)... Returns {rev, ckpt, rev, ckpt, ...}.
local ENDED = 9999999999999
local members = {}
for i = 1, #ARGV, 2 do members[#members + 1] = ARGV[i] end
local got = redis.call('HMGET', KEYS[1], unpack(members))
local out = {}
for i, member in ipairs(members) do
  local rev, ckpt = -1, -1
  if got[i] then
    local r, c = string.match(got[i], '^(%d+)|%d+|%d+|%d*|(%d+)|')
    rev, ckpt = tonumber(r), tonumber(c)
  elseif redis.call('ZSCORE', KEYS[2], member .. '|' .. ARGV[2 * i]) then
    rev, ckpt = tonumber(ARGV[2 * i]), ENDED
  end
  out[2 * i - 1], out[2 * i] = rev, ckpt
end
return out

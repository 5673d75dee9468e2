-- Each member's card revision and checkpoint, or -1, -1 where it has none (read-only: the
-- migrator asks before it reads DynamoDB). KEYS: data. ARGV: members.
-- Returns {rev, ckpt, rev, ckpt, ...}.
local got = redis.call('HMGET', KEYS[1], unpack(ARGV))
local out = {}
for i = 1, #ARGV do
  local rev, ckpt = -1, -1
  if got[i] then
    local r, c = string.match(got[i], '^(%d+)|%d+|%d+|%d*|(%d+)|')
    rev, ckpt = tonumber(r), tonumber(c)
  end
  out[2 * i - 1], out[2 * i] = rev, ckpt
end
return out

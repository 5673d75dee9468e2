-- Prepended to every script (index.Script): one command over many arguments, in pieces
-- Lua's unpack takes (an even size: field-value and score-member pairs stay whole).
local function bulk(cmd, key, args)
  local out = {}
  for i = 1, #args, 1000 do
    local got = redis.call(cmd, key, unpack(args, i, math.min(i + 999, #args)))
    if type(got) == 'table' then
      for j = 1, #args - i + 1 do if j > 1000 then break end out[#out + 1] = got[j] end
    end
  end
  return out
end

-- A script's changes to its bucket, one command each: the dropped members out of both keys,
-- then the new cards and scores.
local function apply(due, data, drops, sets, scores)
  if #drops > 0 then
    bulk('HDEL', data, drops)
    bulk('ZREM', due, drops)
  end
  if #sets > 0 then bulk('HSET', data, sets) end
  if #scores > 0 then bulk('ZADD', due, scores) end
end

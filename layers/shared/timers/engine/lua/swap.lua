-- Compare and set one field of a hash (a bucket's sentinel): set to `new` only if it holds
-- `expected` ('' for absent). KEYS: hash. ARGV: field, expected, new. Returns 1 if set.
local held = redis.call('HGET', KEYS[1], ARGV[1]) or ''
if held ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
return 1

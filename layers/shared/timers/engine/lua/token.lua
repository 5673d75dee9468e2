-- A key held by a token (a run marker): extended to ttl_ms, or deleted when ttl_ms is '',
-- only by its holder. KEYS: key. ARGV: token, ttl_ms. Returns 1 if done.
local key = KEYS[1]
if redis.call('GET', key) ~= ARGV[1] then return 0 end
if ARGV[2] == '' then return redis.call('DEL', key) end
return redis.call('PEXPIRE', key, ARGV[2])

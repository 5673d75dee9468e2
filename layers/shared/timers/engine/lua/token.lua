-- A key held by a token (a run marker: ``token`` queued, ``token@promise`` leasing, ``token~``
-- finishing): extended to ttl_ms (with a promise: the holder's next beat is due by then; with
-- '~': its run leases no more), or deleted when ttl_ms is '', only by its holder.
-- KEYS: key. ARGV: token, ttl_ms[, promise or '~']. Returns 1 if done.
local key = KEYS[1]
local held = redis.call('GET', key)
if not held or string.match(held, '^[^@~]*') ~= ARGV[1] then return 0 end
if ARGV[2] == '' then return redis.call('DEL', key) end
if ARGV[3] == '~' then
  redis.call('SET', key, ARGV[1] .. '~', 'PX', ARGV[2])
  return 1
end
if ARGV[3] and ARGV[3] ~= '' then
  redis.call('SET', key, ARGV[1] .. '@' .. ARGV[3], 'PX', ARGV[2])
  return 1
end
return redis.call('PEXPIRE', key, ARGV[2])

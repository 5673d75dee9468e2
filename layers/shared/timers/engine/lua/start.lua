-- A run marker taken for a new run if its slot is free: absent, or held by a run that leases no
-- more (its value ends with '~': it only finishes its sends). KEYS: marker. ARGV: value,
-- ttl_ms. Returns 1 if taken.
local held = redis.call('GET', KEYS[1])
if held and string.sub(held, -1) ~= '~' then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1

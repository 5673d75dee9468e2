-- What the fan-out needs of a bucket, read-only: its earliest score, how many members may be
-- leased by `until`, its sentinel and warmth fields.
-- KEYS: due, data. ARGV: until, sentinel field, ran field, cold field.
-- Returns {earliest score or -1, count, sentinel, ran, cold} (absent fields: nil).
local due, data = KEYS[1], KEYS[2]
-- the earliest member's score (ended-chain notes, from NOTED = 1e13 on, are no members)
local first = redis.call('ZRANGEBYSCORE', due, '-inf', '(10000000000000', 'LIMIT', 0, 1, 'WITHSCORES')
local count = redis.call('ZCOUNT', due, '-inf', ARGV[1])
local fields = redis.call('HMGET', data, ARGV[2], ARGV[3], ARGV[4])
return {first[2] or '-1', count, fields[1], fields[2], fields[3]}

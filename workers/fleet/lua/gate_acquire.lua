-- gate_acquire.lua: take one fleet-wide model-call slot if one is free.
--
-- KEYS  [1] gate zset (holder token -> ms when its slot expires)
-- ARGV  [1] now (ms)  [2] limit  [3] holder token  [4] slot ttl (ms)
-- Reply 1: the token holds a slot until now + ttl (taken now, or already held and extended)
--     | 0: all `limit` slots are held
-- Guarantees: expired slots (holders that died and stopped renewing) are dropped first, and
-- the count and the add are one step, so at most `limit` unexpired holders ever exist.
local gate, now, token = KEYS[1], tonumber(ARGV[1]), ARGV[3]
local expiry = now + tonumber(ARGV[4])
redis.call('ZREMRANGEBYSCORE', gate, '-inf', now)
if redis.call('ZSCORE', gate, token) then
  redis.call('ZADD', gate, expiry, token)
  return 1
end
if redis.call('ZCARD', gate) < tonumber(ARGV[2]) then
  redis.call('ZADD', gate, expiry, token)
  return 1
end
return 0

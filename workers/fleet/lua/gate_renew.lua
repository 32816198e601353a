-- gate_renew.lua: extend the slots of many holders in one call (the renewer's batch).
--
-- KEYS  [1] gate zset (holder token -> ms when its slot expires)
-- ARGV  [1] now (ms)  [2] slot ttl (ms)  [3..] holder tokens
-- Reply one integer per token, in order: 1 extended to now + ttl | 0 the slot is gone
-- A token still present is extended even if its score has passed: gate_acquire drops expired
-- members before it counts, so a slot still in the set was never given to anyone else.
local gate = KEYS[1]
local expiry = tonumber(ARGV[1]) + tonumber(ARGV[2])
local out = {}
for i = 3, #ARGV do
  if redis.call('ZSCORE', gate, ARGV[i]) then
    redis.call('ZADD', gate, 'XX', expiry, ARGV[i])
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return out

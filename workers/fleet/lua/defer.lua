-- defer.lua: park a started turn because its provider's breaker is open (fencing-checked).
--
-- KEYS  [1] lane hash  [2] inbox  [3] inflight  [4] lease  [5] lanes:queued
--       [6] lanes:running  [7] lanes:dead  (Keys.lane_keys(lane))  [8] deferred:<provider>
--       [9] breakers (the provider is listed there, so recovery always finds this lane)
-- ARGV  [1] lane name  [2] fence  [3] now (ms)  [4] provider  [5] turn id for the resumed turn
--       [6] why (for last_error)
-- Reply {"lost", state}: the fence is not current; NOTHING changed (state: the lane's, ''
--       when its hash is gone: a Redis that lost its data or evicted it) | {"deferred", turn id}
-- Guarantees: the start's attempt is given back (an outage spends no attempts) and the
-- continuous-failure clock stops (the breaker owns the wait); in-flight items and ticks are
-- kept, so the resumed turn gets them first. release.lua queues the lane once the breaker
-- closes (or to carry a probe call).
local lane, lease, running, deferred = KEYS[1], KEYS[4], KEYS[6], KEYS[8]
local name, fence, now = ARGV[1], ARGV[2], ARGV[3]
local f = redis.call('HMGET', lane, 'state', 'fence')
if f[1] ~= 'running' or f[2] ~= fence then
  return {'lost', f[1] or ''}
end
redis.call('DEL', lease)
redis.call('ZREM', running, name)
redis.call('HINCRBY', lane, 'attempts', -1)
redis.call('HDEL', lane, 'failing_since')
redis.call('HSET', lane, 'state', 'deferred', 'provider', ARGV[4], 'turn_id', ARGV[5],
           'last_error', ARGV[6], 'last_error_at', now, 'last_error_kind', 'transient')
redis.call('ZADD', deferred, now, name)
redis.call('SADD', KEYS[9], ARGV[4])
return {'deferred', ARGV[5]}

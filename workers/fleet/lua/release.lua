-- release.lua: queue a lane that was waiting: a failed turn whose backoff is over (state
-- "retry", from fail.lua) or a turn deferred while its provider's breaker was open (state
-- "deferred", from defer.lua). beat's recovery pass calls it; it never sleeps anywhere.
--
-- KEYS  [1] lane hash  [2] inbox  [3] inflight  [4] lease  [5] lanes:queued
--       [6] lanes:running  [7] lanes:dead  (Keys.lane_keys(lane))
--       [8] the waiting set the lane is in (lanes:retry, or deferred:<provider>)
-- ARGV  [1] lane name  [2] now (ms)  [3] the state it must be in: "retry" | "deferred"
-- Reply {"released", turn id, kind}: publish that turn (the id fail/defer stored)
--     | {"skip"}: not yet due, or no longer waiting (the index entry is dropped then)
local lane, queued, waiting = KEYS[1], KEYS[5], KEYS[8]
local name, now, want = ARGV[1], ARGV[2], ARGV[3]
local f = redis.call('HMGET', lane, 'state', 'turn_id', 'kind', 'retry_at')
if f[1] ~= want then
  redis.call('ZREM', waiting, name)
  return {'skip'}
end
if want == 'retry' and tonumber(f[4] or '0') > tonumber(now) then
  return {'skip'}
end
redis.call('ZREM', waiting, name)
redis.call('HDEL', lane, 'retry_at', 'provider')
redis.call('HSET', lane, 'state', 'queued', 'queued_at', now)
redis.call('ZADD', queued, now, name)
return {'released', f[2] or '', f[3] or 'interactive'}

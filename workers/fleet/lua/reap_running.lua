-- reap_running.lua: re-queue a lane whose running turn lost its worker (lease expired).
--
-- KEYS  [1] lane hash  [2] inbox  [3] inflight  [4] lease  [5] lanes:queued
--       [6] lanes:running  [7] lanes:dead                         (Keys.lane_keys(lane))
-- ARGV  [1] lane name  [2] now (ms)  [3] new turn id
-- Reply {"repaired", new turn id, kind} | {"skip"}
-- Acts only when the lane is running, its lanes:running score (lease expiry) is before now AND
-- the lease key is gone. Then: fence += 1 (the lost holder can no longer renew or finish),
-- the loss is counted toward dead-lettering, and the lane is queued with a NEW turn id on the
-- same queue; in-flight items are kept for that turn. A lanes:running entry for a lane that is
-- not running is dropped (the index healed).
local lane, lease, queued, running = KEYS[1], KEYS[4], KEYS[5], KEYS[6]
local name, now = ARGV[1], ARGV[2]
local f = redis.call('HMGET', lane, 'state', 'kind')
if f[1] ~= 'running' then
  redis.call('ZREM', running, name)
  return {'skip'}
end
if redis.call('EXISTS', lease) == 1 then
  return {'skip'}
end
local expiry = redis.call('ZSCORE', running, name)
if expiry and tonumber(expiry) >= tonumber(now) then
  return {'skip'}
end
redis.call('HINCRBY', lane, 'fence', 1)
redis.call('HINCRBY', lane, 'lost', 1)
redis.call('HSET', lane, 'state', 'queued', 'turn_id', ARGV[3], 'queued_at', now)
redis.call('ZREM', running, name)
redis.call('ZADD', queued, now, name)
return {'repaired', ARGV[3], f[2] or 'interactive'}

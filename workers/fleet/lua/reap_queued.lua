-- reap_queued.lua: re-publish a turn that has been queued too long (its message was lost).
--
-- KEYS  [1] lane hash  [2] inbox  [3] inflight  [4] lease  [5] lanes:queued
--       [6] lanes:running  [7] lanes:dead                         (Keys.lane_keys(lane))
-- ARGV  [1] lane name  [2] now (ms)  [3] queued_after (ms)
-- Reply {"repaired", turn id, kind, why}: publish the SAME turn id again (if the first message was
--       only slow, start drops the second as a duplicate/stale); queued_at is reset to now
--     | {"skip"}
-- A lanes:queued entry for a lane that is not queued is dropped (the index healed).
local lane, queued = KEYS[1], KEYS[5]
local name, now = ARGV[1], tonumber(ARGV[2])
local f = redis.call('HMGET', lane, 'state', 'turn_id', 'kind', 'queued_at')
if f[1] ~= 'queued' then
  redis.call('ZREM', queued, name)
  return {'skip'}
end
if tonumber(f[4] or '0') > now - tonumber(ARGV[3]) then
  return {'skip'}
end
redis.call('HSET', lane, 'queued_at', ARGV[2])
redis.call('ZADD', queued, ARGV[2], name)
-- queued_at 0: unsent.lua marked a turn whose wake-up the broker refused (not a lost message)
local why = (tonumber(f[4] or '') == 0) and 'unsent' or 'queued_too_long'
return {'repaired', f[2] or '', f[3] or 'interactive', why}

-- forget.lua: remove a dead-lettered lane whose persona is gone, with what it kept.
--
-- KEYS  [1] lane hash  [2] inbox  [3] inflight  [4] lease  [5] lanes:queued
--       [6] lanes:running  [7] lanes:dead                         (Keys.lane_keys(lane))
-- ARGV  [1] lane name
-- Reply {"forgotten", items dropped} | {"not_dead", state}: NOTHING changed.
-- Only a dead lane: a lane in any other state may have a worker on it. The caller checks that
-- the persona directory is gone (a persona still there is revived, not forgotten); its items
-- could only fail again, and a dead lane of a removed persona otherwise stays in lanes:dead
-- (and in the dead-lettered alert) for ever.
local lane, dead = KEYS[1], KEYS[7]
local state = redis.call('HGET', lane, 'state') or 'idle'
if state ~= 'dead' then
  return {'not_dead', state}
end
local dropped = redis.call('LLEN', KEYS[2]) + redis.call('LLEN', KEYS[3])
redis.call('DEL', lane, KEYS[2], KEYS[3], KEYS[4])
redis.call('ZREM', KEYS[5], ARGV[1])
redis.call('ZREM', KEYS[6], ARGV[1])
redis.call('ZREM', dead, ARGV[1])
return {'forgotten', dropped}

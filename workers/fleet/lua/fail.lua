-- fail.lua: a turn ended in error (fencing-checked): record it, then retry or dead-letter.
--
-- KEYS  [1] lane hash  [2] inbox  [3] inflight list  [4] lease  [5] lanes:queued
--       [6] lanes:running  [7] lanes:dead                         (Keys.lane_keys(lane))
-- ARGV  [1] lane name  [2] fence  [3] now (ms)  [4] error text  [5] retry turn id
--       [6] max_attempts
-- Reply {"lost"}: the fence is not current; NOTHING changed
--     | {"dead", turn_id, kind}: attempts reached max_attempts; the lane is dead-lettered
--     | {"queued", turn_id, kind, retry turn id}: queued again on the same queue
-- Guarantees: in-flight items and ticks are KEPT either way (the retry, or the turn after a
-- revive, gets them first); last_error/last_error_at always say why.
local lane, lease = KEYS[1], KEYS[4]
local queued, running, dead = KEYS[5], KEYS[6], KEYS[7]
local name, fence, now = ARGV[1], ARGV[2], ARGV[3]

local f = redis.call('HMGET', lane, 'state', 'fence', 'turn_id', 'kind', 'attempts')
if f[1] ~= 'running' or f[2] ~= fence then
  return {'lost'}
end
local turn_id, kind = f[3] or '', f[4] or 'interactive'

redis.call('DEL', lease)
redis.call('ZREM', running, name)
redis.call('HSET', lane, 'last_error', ARGV[4], 'last_error_at', now,
           'last_turn', turn_id, 'last_status', 'error', 'last_end', now)
if tonumber(f[5] or '0') >= tonumber(ARGV[6]) then
  redis.call('HSET', lane, 'state', 'dead')
  redis.call('ZADD', dead, now, name)
  return {'dead', turn_id, kind}
end
redis.call('HSET', lane, 'state', 'queued', 'turn_id', ARGV[5], 'queued_at', now)
redis.call('ZADD', queued, now, name)
return {'queued', turn_id, kind, ARGV[5]}

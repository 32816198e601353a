-- receive.lua: a worker took a turn message from the broker: mark the lane claimed by it.
--
-- KEYS  [1] lane hash  [2] claim:<lane>  [3] lanes:claimed
-- ARGV  [1] lane name  [2] turn id (from the message)  [3] worker  [4] now (ms)
--       [5] claim ttl (ms)
-- Reply 1 claimed | 0 not the lane's queued turn (a duplicate or stale message: start drops it)
-- Why: between taking a message and starting its turn a worker can die, and the broker only
-- redelivers after its visibility timeout (hours). The claim is a short-TTL key the worker's
-- renewer keeps alive until start.lua deletes it; beat's recovery pass re-publishes a queued
-- lane whose claim lapsed (reap_claimed.lua) within seconds. Re-publishing is safe: start
-- drops duplicates and stale turn ids.
local f = redis.call('HMGET', KEYS[1], 'state', 'turn_id')
if f[1] ~= 'queued' or f[2] ~= ARGV[2] then
  return 0
end
redis.call('SET', KEYS[2], ARGV[3] .. '|' .. ARGV[2], 'PX', ARGV[5])
redis.call('ZADD', KEYS[3], ARGV[4], ARGV[1])
return 1

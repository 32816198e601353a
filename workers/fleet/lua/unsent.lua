-- unsent.lua: a queued turn whose wake-up could not be sent goes to the reaper's next pass.
--
-- KEYS  [1] lane hash  [5] lanes:queued                           (Keys.lane_keys(lane))
-- ARGV  [1] lane name  [2] the turn id whose message was not sent
-- Reply 1 when marked; 0 when the lane moved on (started, finished, another turn queued).
-- Why: the reaper re-publishes a queued turn only once it has waited SOULFLEET_REAP_QUEUED_AFTER
-- (600 s: a message may just be slow). A turn known never to have been sent need not wait:
-- its queued time is set to 0, so the next pass (SOULFLEET_REAP_INTERVAL) sends it. If it was
-- sent after all, the worker's start drops the second message as a duplicate.
-- It must also work on a FULL Redis (noeviction at maxmemory), the usual reason a publish to
-- the same Redis was refused: Redis refuses a script's first memory-using write then, but not
-- one that follows any write, so the first write is a ZREM (never refused) of the entry the
-- ZADD puts back.
local lane, queued = KEYS[1], KEYS[5]
local f = redis.call('HMGET', lane, 'state', 'turn_id')
if f[1] ~= 'queued' or f[2] ~= ARGV[2] then
  return 0
end
redis.call('ZREM', queued, ARGV[1])
redis.call('ZADD', queued, 0, ARGV[1])
redis.call('HSET', lane, 'queued_at', 0)
return 1

-- unsent.lua: a queued turn whose wake-up could not be sent goes to the reaper's next pass.
--
-- KEYS  [1] lane hash  [5] lanes:queued                           (Keys.lane_keys(lane))
-- ARGV  [1] lane name  [2] the turn id whose message was not sent
-- Reply 1 when marked; 0 when the lane moved on (started, finished, another turn queued).
-- Why: the reaper re-publishes a queued turn only once it has waited SOULFLEET_REAP_QUEUED_AFTER
-- (600 s: a message may just be slow). A turn known never to have been sent need not wait:
-- its queued time is set to 0, so the next pass (SOULFLEET_REAP_INTERVAL) sends it. If it was
-- sent after all, the worker's start drops the second message as a duplicate.
local lane, queued = KEYS[1], KEYS[5]
local f = redis.call('HMGET', lane, 'state', 'turn_id')
if f[1] ~= 'queued' or f[2] ~= ARGV[2] then
  return 0
end
redis.call('HSET', lane, 'queued_at', 0)
redis.call('ZADD', queued, 0, ARGV[1])
return 1

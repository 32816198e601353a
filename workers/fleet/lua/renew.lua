-- renew.lua: extend a running turn's lease, only while it is still this holder's.
--
-- KEYS  [1] lane hash  [2] inbox  [3] inflight  [4] lease  [5] lanes:queued
--       [6] lanes:running  [7] lanes:dead                         (Keys.lane_keys(lane))
-- ARGV  [1] lane name  [2] fence  [3] now (ms)  [4] lease ttl (ms)
-- Reply 1 renewed | 0 lost: the lane is no longer running with this fence (another start or
--       the reaper bumped it, or the turn ended) or the lease key is gone or not ours.
-- Guarantees: the check and the extension are one step. A lease that lapsed is never taken
-- back: once it expired, a redelivered start or the reaper may act at any moment, so the
-- holder must stop (its next write would be refused by the fence anyway).
local f = redis.call('HMGET', KEYS[1], 'state', 'fence')
if f[1] ~= 'running' or f[2] ~= ARGV[2] then
  return 0
end
local held = redis.call('GET', KEYS[4])
if not held or string.sub(held, 1, #ARGV[2] + 1) ~= ARGV[2] .. ':' then
  return 0
end
redis.call('PEXPIRE', KEYS[4], ARGV[4])
redis.call('ZADD', KEYS[6], tonumber(ARGV[3]) + tonumber(ARGV[4]), ARGV[1])
return 1

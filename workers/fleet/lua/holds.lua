-- holds.lua: does the holder of fence still own the lane? (read only)
--
-- KEYS  [1] lane hash  [2] inbox  [3] inflight  [4] lease  [5] lanes:queued
--       [6] lanes:running  [7] lanes:dead                         (Keys.lane_keys(lane))
-- ARGV  [1] lane name  [2] fence
-- Reply 1 when the lane is running with this fence AND the lease key is alive and carries it,
--       else 0. One atomic read, so the three checks see the same moment.
local f = redis.call('HMGET', KEYS[1], 'state', 'fence')
if f[1] ~= 'running' or f[2] ~= ARGV[2] then
  return 0
end
local held = redis.call('GET', KEYS[4])
if not held or string.sub(held, 1, #ARGV[2] + 1) ~= ARGV[2] .. ':' then
  return 0
end
return 1

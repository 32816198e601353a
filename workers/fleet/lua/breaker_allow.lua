-- breaker_allow.lua: may a worker call this provider now?
--
-- KEYS  [1] breaker:<provider>
-- ARGV  [1] now (ms)  [2] probe ttl (ms): how long one probe call may take
--       [3] the lane asking (recorded as probe_lane: its reap frees the slot, breaker_release)
-- Reply "closed": call | "probe": call, you are the one probe while the breaker is open
--     | "open": do not call (the caller defers its turn, spending nothing)
-- Guarantees: while open, at most one probe call per probe interval fleet-wide (a probe whose
-- worker died frees its turn when the reaper reaps its lane, else after the probe ttl).
local f = redis.call('HMGET', KEYS[1], 'state', 'probe_at', 'probe_until')
if f[1] ~= 'open' then
  return 'closed'
end
local now = tonumber(ARGV[1])
if now >= tonumber(f[2] or '0') and tonumber(f[3] or '0') <= now then
  redis.call('HSET', KEYS[1], 'probe_until', now + tonumber(ARGV[2]), 'probe_lane', ARGV[3] or '')
  redis.call('HINCRBY', KEYS[1], 'probes', 1)
  return 'probe'
end
return 'open'

-- breaker_release.lua: free the probe slot of a probe whose worker died.
--
-- KEYS  [1] breaker:<provider>
-- ARGV  [1] now (ms), then the lanes the reaper found running with a lapsed lease (their
--       workers are gone)
-- Reply 1 when the provider's probe belonged to one of them and its slot was freed, else 0.
-- A probe holds its slot for as long as a call may take (every try of the model timeout):
-- its worker dying held every deferred lane of the provider that long, the provider well
-- again. The probing lane's reap frees it, so the next probe goes within a probe interval.
local f = redis.call('HMGET', KEYS[1], 'probe_lane', 'probe_until')
local probing = f[1]
if not probing or probing == '' or tonumber(f[2] or '0') <= tonumber(ARGV[1]) then
  return 0  -- no probe holds the slot now
end
for i = 2, #ARGV do
  if ARGV[i] == probing then
    redis.call('HSET', KEYS[1], 'probe_until', 0)
    redis.call('HDEL', KEYS[1], 'probe_lane')
    return 1
  end
end
return 0

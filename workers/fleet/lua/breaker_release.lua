-- breaker_release.lua: free the probe slot of a probe whose worker died.
--
-- KEYS  [1] breaker:<provider>
-- ARGV  lanes the reaper found running with a lapsed lease (their workers are gone)
-- Reply 1 when the provider's probe belonged to one of them and its slot was freed, else 0.
-- A probe holds its slot for as long as a call may take (every try of the model timeout):
-- its worker dying held every deferred lane of the provider that long, the provider well
-- again. The probing lane's reap frees it, so the next probe goes within a probe interval.
local probing = redis.call('HGET', KEYS[1], 'probe_lane')
if not probing or probing == '' then
  return 0
end
for i = 1, #ARGV do
  if ARGV[i] == probing then
    redis.call('HSET', KEYS[1], 'probe_until', 0)
    redis.call('HDEL', KEYS[1], 'probe_lane')
    return 1
  end
end
return 0

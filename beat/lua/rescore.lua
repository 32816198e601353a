-- rescore.lua: write the next due times of members this sweep claimed, unless someone else
-- changed them since.
--
-- Compare-and-set on the claim score: if a registry sync re-scored the member (changed spec),
-- removed it (persona deleted), or another beat re-claimed it after our claim timed out, our
-- value is stale and is dropped; theirs stands.
--
-- KEYS  [1] schedule
-- ARGV  [1] the claim score (ms) this sweep wrote, then pairs: member, next due (ms)
-- Reply how many members were re-scored
local schedule, claimed = KEYS[1], tonumber(ARGV[1])
local written = 0
for i = 2, #ARGV, 2 do
  local member = ARGV[i]
  if tonumber(redis.call('ZSCORE', schedule, member)) == claimed then
    redis.call('ZADD', schedule, 'XX', ARGV[i + 1], member)
    written = written + 1
  end
end
return written

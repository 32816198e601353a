-- rescore.lua: write the next due times of members this sweep claimed, unless someone else
-- changed them since.
--
-- Compare-and-set on the claim score: if a registry sync re-scored the member (changed spec),
-- removed it (persona deleted), or another beat re-claimed it after our claim timed out, our
-- value is stale and is dropped; theirs stands.
--
-- KEYS  [1] schedule
-- ARGV  [1] the claim score (ms) this sweep wrote
--       [2] one line per member: "<member>\t<next due ms>", lines joined by "\n" (one argument
--           instead of two per member: the client encodes every argument on its own)
-- Reply how many members were re-scored
local schedule, claimed = KEYS[1], tonumber(ARGV[1])
local written = 0
for member, due in string.gmatch(ARGV[2], '([^\t\n]+)\t(%d+)') do
  if tonumber(redis.call('ZSCORE', schedule, member)) == claimed then
    redis.call('ZADD', schedule, 'XX', due, member)
    written = written + 1
  end
end
return written

-- claim.lua: atomically claim up to LIMIT due schedule members and return them with their scores.
--
-- A claimed member is re-scored to now + claim timeout before the script returns, so a second
-- beat running the same script sees it as not due: two beats can never claim one due member
-- twice. The claimer then writes each member's real next due time (sweep_apply.lua in
-- workers/fleet/lua); if it dies before that, the member becomes due again when the claim times
-- out (one late tick, no loss).
--
-- Specs are not returned: the sweep keeps them by member and re-reads them (HMGET) only when
-- the spec epoch moved, which every writer of schedule:spec bumps. Shipping every member's
-- spec JSON on every sweep was most of a 100,000-lane sweep's reply.
--
-- KEYS  [1] schedule (zset member -> due ms)  [2] schedule:spec epoch (a counter)
-- ARGV  [1] now (ms)  [2] claim until (ms)  [3] limit
-- Reply {spec epoch ("0" if never bumped), claimed}: claimed is one string,
--       "<member>\t<due score ms>" per member, all joined by "\t" ("" when nothing is due).
--       One bulk string instead of two replies per member: the client parses every reply
--       element in Python. Members never contain a tab (registry names forbid it).
local schedule, epoch_key = KEYS[1], KEYS[2]
local now, claim_until, limit = ARGV[1], ARGV[2], tonumber(ARGV[3])
local due = redis.call('ZRANGEBYSCORE', schedule, '-inf', now, 'WITHSCORES', 'LIMIT', 0, limit)
local args = {}
for i = 1, #due, 2 do
  args[#args + 1] = claim_until
  args[#args + 1] = due[i]
  if #args >= 1000 then
    redis.call('ZADD', schedule, 'XX', unpack(args))
    args = {}
  end
end
if #args > 0 then
  redis.call('ZADD', schedule, 'XX', unpack(args))
end
return {redis.call('GET', epoch_key) or '0', table.concat(due, '\t')}

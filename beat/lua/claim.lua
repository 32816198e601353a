-- claim.lua: atomically claim up to LIMIT due schedule members and return them with their specs.
--
-- A claimed member is re-scored to now + claim timeout before the script returns, so a second
-- beat running the same script sees it as not due: two beats can never claim one due member
-- twice. The claimer then writes each member's real next due time (rescore.lua); if it dies
-- before that, the member becomes due again when the claim times out (one late tick, no loss).
--
-- KEYS  [1] schedule (zset member -> due ms)  [2] schedule:spec (hash member -> JSON spec)
-- ARGV  [1] now (ms)  [2] claim until (ms)  [3] limit
-- Reply a flat array, 3 entries per claimed member: member, due score (ms), spec JSON ("" if
--       the spec is missing: the caller drops such a member)
local schedule, specs = KEYS[1], KEYS[2]
local now, claim_until, limit = ARGV[1], ARGV[2], tonumber(ARGV[3])
local due = redis.call('ZRANGEBYSCORE', schedule, '-inf', now, 'WITHSCORES', 'LIMIT', 0, limit)
local out = {}
for i = 1, #due, 2 do
  local member = due[i]
  redis.call('ZADD', schedule, 'XX', claim_until, member)
  out[#out + 1] = member
  out[#out + 1] = due[i + 1]
  out[#out + 1] = redis.call('HGET', specs, member) or ''
end
return out

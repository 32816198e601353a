-- reschedule.lua: a registry sync writes one member's (new or changed) spec and due time,
-- unless a sweep moved the member on since the sync read it.
--
-- The sync reads specs and scores, compares in Python, then writes. A sweep may claim and
-- re-score the member in between (it ticked the slot the sync read): writing the sync's due
-- then would put the member back on a slot already ticked, and it would tick twice. So the
-- score is compare-and-set against what the sync read; the spec is always written (the next
-- sweep uses it; at worst one tick lands on the old spec's grid).
--
-- KEYS  [1] schedule  [2] schedule:spec
-- ARGV  [1] member  [2] the score the sync read ("" = none)  [3] spec JSON  [4] new due (ms)
-- Reply 1 when the due was written, 0 when a sweep's newer score was kept
local schedule, specs, member = KEYS[1], KEYS[2], ARGV[1]
redis.call('HSET', specs, member, ARGV[3])
local current = redis.call('ZSCORE', schedule, member)
local expected = ARGV[2]
if (expected == '' and not current) or (current and expected ~= '' and
    tonumber(current) == tonumber(expected)) then
  redis.call('ZADD', schedule, ARGV[4], member)
  return 1
end
return 0

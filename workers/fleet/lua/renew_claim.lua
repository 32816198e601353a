-- renew_claim.lua: extend a receive claim (receive.lua) while it is still the one taken for
-- this turn.
--
-- KEYS  [1] claim:<lane>
-- ARGV  [1] turn id  [2] ttl (ms)
-- Reply 1 renewed | 0 gone (the turn started, or it lapsed) or the claim of another turn now
-- Why compare: in a prefork pool the claim is taken in the main process and dropped in the
-- child that starts the turn, so the main process renews until it finds the claim gone; by
-- then another worker may have claimed the lane's next turn, and a blind PEXPIRE kept that
-- worker's claim alive after it died (its turn then waited for the 600 s reaper).
local held = redis.call('GET', KEYS[1])
if not held or string.sub(held, -(#ARGV[1] + 1)) ~= '|' .. ARGV[1] then
  return 0
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1

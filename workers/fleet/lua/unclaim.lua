-- unclaim.lua: the publisher of a follow-up turn has published it: drop its claim.
--
-- KEYS  [1] claim:<lane>  [2] lanes:claimed
-- ARGV  [1] lane name  [2] "<worker>|<turn id>" (the claim finish.lua set for it)
-- Reply 1 dropped | 0 the claim is another's now (the worker that took the message claimed
--       the lane on receipt: receive.lua) or it lapsed: left alone
-- Why compare first: a worker may already have taken the published message and claimed the
-- lane itself; deleting that claim would lose the fast recovery if that worker died.
if redis.call('GET', KEYS[1]) ~= ARGV[2] then
  return 0
end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
return 1

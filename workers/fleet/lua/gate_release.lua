-- gate_release.lua: give a model-call slot back.
--
-- KEYS  [1] gate zset (holder token -> ms when its slot expires)
-- ARGV  [1] holder token
-- Reply 1 released | 0 the slot had already expired (and may have been reused)
return redis.call('ZREM', KEYS[1], ARGV[1])

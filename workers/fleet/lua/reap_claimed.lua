-- reap_claimed.lua: re-publish a queued turn whose message a dead worker had taken.
--
-- KEYS  [1] lane hash  [2] claim:<lane>  [3] lanes:claimed  [4] lanes:queued
-- ARGV  [1] lane name  [2] now (ms)
-- Reply {"repaired", turn id, kind}: publish the SAME turn id again
--     | {"alive"}: the claim key still lives (its worker renews it): leave the lane alone
--     | {"skip"}: the lane is no longer queued (it started, or moved on); index entry dropped
local lane, claim, claimed, queued = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local name, now = ARGV[1], ARGV[2]
if redis.call('EXISTS', claim) == 1 then
  return {'alive'}
end
redis.call('ZREM', claimed, name)
local f = redis.call('HMGET', lane, 'state', 'turn_id', 'kind')
if f[1] ~= 'queued' then
  return {'skip'}
end
redis.call('HSET', lane, 'queued_at', now)
redis.call('ZADD', queued, now, name)
return {'repaired', f[2] or '', f[3] or 'interactive'}

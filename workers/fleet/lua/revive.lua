-- revive.lua: take a dead-lettered lane back into service with a fresh attempt count.
--
-- KEYS  [1] lane hash  [2] inbox  [3] inflight  [4] lease  [5] lanes:queued
--       [6] lanes:running  [7] lanes:dead  (Keys.lane_keys(lane))  [8] lanes:retry
--       [9] deferred:<provider> of the lane's provider (optional: only when it has one)
--       [10] breakers (with [9]: the set recovery reads to find deferred lanes)
-- ARGV  [1] lane name  [2] now (ms)  [3] new turn id  [4] "1": drop the in-flight items
--       [5] the lane's provider ('' for none)  [6] "1": only put back an index entry the
--       lane's state has lost (`revive --all`'s repair: no retry run early, no dead lane
--       revived: those are the operator's own asks)
-- Reply {"queued", turn id, kind, items dropped}: the lane was dead and now has a queued turn
--       (same kind as the turn that died, or heartbeat when ARGV[4] dropped the items of a
--       heartbeat's turn a post had joined); its in-flight items (the ones the dead turn held)
--       are kept and run first, unless ARGV[4] drops them: a message the provider refuses for
--       good (a 400 on its content) would dead-letter the lane again at every revive. The
--       inbox (posted since) is kept either way.
--     | {"requeued", turn id, kind, 0}: the lane was queued but missing from lanes:queued
--       (its index entry evicted): put back, to publish its turn again
--     | {"retried", turn id, kind, items dropped}: the lane was waiting out a retry backoff (a
--       provider's Retry-After holds it up to an hour): queued now, its attempt count kept,
--       to publish; ARGV[4] drops its in-flight items as for a dead lane
--     | {"reindexed", state}: the lane was running, deferred (or, with ARGV[6], retrying) but
--       missing from that index (evicted): put back, for the reaper (its lease-expiry score 0:
--       taken back at its next pass once the lease is gone), the breaker's resume (the
--       provider listed in breakers again) or beat's release at its retry_at; no turn to
--       publish
--     | {"not_dead", state}: NOTHING changed
local lane, queued, dead = KEYS[1], KEYS[5], KEYS[7]
local f = redis.call('HMGET', lane, 'state', 'kind', 'turn_id', 'retry_at')
local state = f[1] or 'idle'
if state == 'queued' and f[3] and not redis.call('ZSCORE', queued, ARGV[1]) then
  -- Queued, but missing from lanes:queued (Redis evicted or someone deleted keys): no reaper
  -- pass could ever see it, and it stayed queued for ever. Back into the index as a turn
  -- never sent (unsent.lua's mark): the caller publishes it now, the reaper again if needed.
  redis.call('ZADD', queued, 0, ARGV[1])
  redis.call('HSET', lane, 'queued_at', 0)
  return {'requeued', f[3], f[2] or 'interactive', 0}
end
if state == 'running' and not redis.call('ZSCORE', KEYS[6], ARGV[1]) then
  redis.call('ZADD', KEYS[6], 0, ARGV[1])
  return {'reindexed', state}
end
if state == 'deferred' and KEYS[10] and (not redis.call('ZSCORE', KEYS[9], ARGV[1])
    or redis.call('SISMEMBER', KEYS[10], ARGV[5]) == 0) then
  redis.call('ZADD', KEYS[9], ARGV[2], ARGV[1])
  redis.call('SADD', KEYS[10], ARGV[5])
  return {'reindexed', state}
end
if ARGV[6] == '1' then
  if state == 'retry' and not redis.call('ZSCORE', KEYS[8], ARGV[1]) then
    redis.call('ZADD', KEYS[8], tonumber(f[4] or ARGV[2]), ARGV[1])
    return {'reindexed', state}
  end
  return {'not_dead', state}
end
local function drop_kept()
  if ARGV[4] ~= '1' then
    return 0
  end
  local dropped = redis.call('LLEN', KEYS[3])
  redis.call('DEL', KEYS[3])
  -- The dropped work is over: the next turn's work gets an id of its own (lane:born:commits),
  -- or a memory write it repeats would be answered from the dead work's ledger, not applied.
  redis.call('HINCRBY', lane, 'commits', 1)
  return dropped
end
-- The kind of the turn that runs what is left: items and ticks made a heartbeat's turn a
-- conversation (start.lua); with the items dropped, what is left is the heartbeat again, run
-- under its own model and budget rules, not the conversation's.
local function kind_left(dropped)
  local kind = f[2] or 'interactive'
  if dropped > 0 and kind == 'interactive'
      and tonumber(redis.call('HGET', lane, 'inflight_ticks') or '0') > 0 then
    kind = 'heartbeat'
    redis.call('HSET', lane, 'kind', kind)
  end
  return kind
end
if state == 'retry' and f[3] and KEYS[8] then
  -- The operator's "try now" (the provider is back before its Retry-After said): what
  -- release.lua does when the backoff is over, early.
  local dropped = drop_kept()
  local kind = kind_left(dropped)
  redis.call('ZREM', KEYS[8], ARGV[1])
  redis.call('HDEL', lane, 'retry_at', 'provider')
  redis.call('HSET', lane, 'state', 'queued', 'queued_at', ARGV[2])
  redis.call('ZADD', queued, ARGV[2], ARGV[1])
  return {'retried', f[3], kind, dropped}
end
if state ~= 'dead' then
  return {'not_dead', state}
end
local dropped = drop_kept()
local kind = kind_left(dropped)
redis.call('HDEL', lane, 'failing_since', 'failures', 'retry_at', 'provider')
redis.call('HSET', lane, 'state', 'queued', 'attempts', 0, 'lost', 0, 'turn_id', ARGV[3],
           'kind', kind, 'queued_at', ARGV[2])
redis.call('ZREM', dead, ARGV[1])
redis.call('ZADD', queued, ARGV[2], ARGV[1])
return {'queued', ARGV[3], kind, dropped}

-- fail.lua: a turn ended in error (fencing-checked): record it, then retry, wait or dead-letter,
-- by the failure's kind.
--
-- KEYS  [1] lane hash  [2] inbox  [3] inflight list  [4] lease  [5] lanes:queued
--       [6] lanes:running  [7] lanes:dead  (Keys.lane_keys(lane))  [8] lanes:retry
--       [9] claim:<lane>  [10] lanes:claimed
-- ARGV  [1] lane name  [2] fence  [3] now (ms)  [4] error text  [5] retry turn id
--       [6] max_attempts  [7] kind: "transient" | "permanent" | "unknown"
--       [8] backoff base (ms; 0 = queue the retry now)  [9] backoff cap (ms)
--       [10] jitter, a uniform random number in [0, 1) drawn by the caller  [11] retry_for (ms)
--       [12] who publishes a retry queued now ("" for no claim)  [13] its claim ttl (ms)
--       [14] the least delay (ms): what the provider asked to be left alone for (0: none)
-- Reply {"lost", state}: the fence is not current; NOTHING changed (state: the lane's, ''
--       when its hash is gone: a Redis that lost its data or evicted it)
--     | {"dead", turn_id, kind, reason}: the lane is dead-lettered; reason is its last_error
--     | {"queued", turn_id, kind, retry turn id}: queued again now (the delay came out 0)
--     | {"retry", turn_id, kind, retry turn id, retry_at}: waits in lanes:retry until retry_at;
--       beat's recovery pass (release.lua) queues it then
-- Dead-lettering by kind: "permanent" at once (asking again cannot help); "transient" only
-- once the lane has failed continuously for retry_for (failing_since, cleared by finish), and
-- a transient failure gives its start's attempt back, so an outage never spends the attempts
-- that count crashes; "unknown" after max_attempts attempts in a row, as before kinds existed.
-- Guarantees: in-flight items and ticks are KEPT either way (the retry, or the turn after a
-- revive, gets them first); last_error/last_error_at always say why. The backoff is
-- exponential with full jitter: jitter * min(cap, base * 2^(failures - 1)), failures counting
-- this lane's failed turns since its last success. A retry queued now is claimed for its
-- publisher, as finish.lua claims a follow-up (a publisher killed before the publish leaves a
-- claim that lapses, and beat re-publishes the turn).
local lane, lease = KEYS[1], KEYS[4]
local queued, running, dead, retry = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local name, fence, now, kind = ARGV[1], ARGV[2], ARGV[3], ARGV[7]

local f = redis.call('HMGET', lane, 'state', 'fence', 'turn_id', 'kind', 'attempts',
                     'failing_since')
if f[1] ~= 'running' or f[2] ~= fence then
  return {'lost', f[1] or ''}
end
local turn_id, turn_kind = f[3] or '', f[4] or 'interactive'
local since = tonumber(f[6] or now)

redis.call('DEL', lease)
redis.call('ZREM', running, name)
redis.call('HSET', lane, 'last_error', ARGV[4], 'last_error_at', now, 'last_error_kind', kind,
           'last_turn', turn_id, 'last_status', 'error', 'last_end', now,
           'failing_since', since)
local failures = redis.call('HINCRBY', lane, 'failures', 1)

local reason = nil
if kind == 'permanent' then
  reason = 'permanent failure, not retried: ' .. ARGV[4]
elseif kind == 'transient' then
  redis.call('HINCRBY', lane, 'attempts', -1)
  if tonumber(now) - since >= tonumber(ARGV[11]) then
    reason = 'transient failures for ' .. math.floor((tonumber(now) - since) / 1000) ..
             's (SOULFLEET_RETRY_FOR), last: ' .. ARGV[4]
  end
elseif tonumber(f[5] or '0') >= tonumber(ARGV[6]) then
  reason = ARGV[4]
end
if reason then
  redis.call('HSET', lane, 'state', 'dead', 'last_error', reason)
  redis.call('ZADD', dead, now, name)
  return {'dead', turn_id, turn_kind, reason}
end
local step = math.min(tonumber(ARGV[9]), tonumber(ARGV[8]) * 2 ^ math.min(failures - 1, 40))
local delay = math.max(math.floor(tonumber(ARGV[10]) * step), tonumber(ARGV[14] or '0'))
if delay > 0 then
  local at = tonumber(now) + delay
  redis.call('HSET', lane, 'state', 'retry', 'turn_id', ARGV[5], 'retry_at', at)
  redis.call('ZADD', retry, at, name)
  return {'retry', turn_id, turn_kind, ARGV[5], at}
end
redis.call('HSET', lane, 'state', 'queued', 'turn_id', ARGV[5], 'queued_at', now)
redis.call('ZADD', queued, now, name)
if (ARGV[12] or '') ~= '' then
  redis.call('SET', KEYS[9], ARGV[12] .. '|' .. ARGV[5], 'PX', ARGV[13])
  redis.call('ZADD', KEYS[10], now, name)
end
return {'queued', turn_id, turn_kind, ARGV[5]}

-- post.lua: append one item to a lane's bounded inbox; wake the lane if asked and idle.
--
-- KEYS  [1] lane hash  [2] inbox list  [3] inflight list  [4] lease  [5] lanes:queued
--       [6] lanes:running  [7] lanes:dead                         (Keys.lane_keys(lane))
-- ARGV  [1] lane name  [2] item JSON  [3] wake "1"|"0"  [4] inbox_max  [5] now (ms)
--       [6] turn id for the turn this post may queue (unused unless it queues)
--       [7] "1": end the lane's session (session_epoch + 1) with the item, only if it is
--           accepted (a refused post changes nothing); absent or "0": keep it
-- Reply {outcome, inbox depth}, or {"queued", depth, turn_id} when a turn must be published:
--   "full"     the inbox already holds inbox_max items: the item was NOT written. Reply
--              {"full", depth, turn_id or "", state}: an idle lane woken by this post gets a
--              turn to drain its inbox all the same (turn_id: publish it), since no turn may
--              ever come otherwise (no heartbeat reads it, every item posted without a wake)
--   "dead"     the lane is dead-lettered: the item is kept (never dropped), no turn queued
--   "queued"   the lane was idle and wake was asked: a new interactive turn is queued
--   "pending"  the item waits for the lane's queued or running turn, or for a later wake
-- Also sets the lane's last_post (now) for every accepted item.
-- Guarantees: the bound check and the push are one atomic step, so concurrent posters can
-- never overshoot inbox_max; an accepted item is never dropped.
local lane, inbox, queued = KEYS[1], KEYS[2], KEYS[5]

-- Queue an interactive turn if the lane is idle and the post asks to wake it; true if it did.
local function wake(state)
  if state ~= 'idle' or ARGV[3] ~= '1' then
    return false
  end
  redis.call('HSET', lane, 'state', 'queued', 'turn_id', ARGV[6], 'kind', 'interactive',
             'queued_at', ARGV[5])
  redis.call('ZADD', queued, ARGV[5], ARGV[1])
  return true
end

local depth = redis.call('LLEN', inbox)
if depth >= tonumber(ARGV[4]) then
  local state = redis.call('HGET', lane, 'state') or 'idle'
  if wake(state) then
    return {'full', depth, ARGV[6], state}
  end
  return {'full', depth, '', state}
end
depth = redis.call('RPUSH', inbox, ARGV[2])
-- When the last inbound post arrived: an idle persona's heartbeat stretches (heartbeat.idle_*).
redis.call('HSET', lane, 'last_post', ARGV[5])
if ARGV[7] == '1' then
  redis.call('HINCRBY', lane, 'session_epoch', 1)
end

local state = redis.call('HGET', lane, 'state') or 'idle'
if state == 'dead' then
  return {'dead', depth}
end
if wake(state) then
  return {'queued', depth, ARGV[6]}
end
return {'pending', depth}

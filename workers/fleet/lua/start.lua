-- start.lua: a worker begins the queued turn: reject duplicates and stale messages, count the
-- attempt, take the lease with a new fence and drain the inbox and ticks into in-flight.
--
-- KEYS  [1] lane hash  [2] inbox list  [3] inflight list  [4] lease  [5] lanes:queued
--       [6] lanes:running  [7] lanes:dead  (Keys.lane_keys(lane))  [8] claim:<lane>
--       [9] lanes:claimed
-- ARGV  [1] lane name  [2] turn id (from the turn message)  [3] worker  [4] now (ms)
--       [5] lease ttl (ms)  [6] max_attempts  [7] most bytes of inbox items one turn takes (0:
--       no bound; a first item is always taken): the rest stay in the inbox, and finish
--       queues the turn after this one for them
-- Reply {"dead", last_error} | {"stale"} | {"duplicate"}
--     | {"started", fence, attempt, kind, ticks, recovered, commits, session, session_epoch,
--        last_pass, born, failing, failing_since, item JSON...}
--       items: the in-flight items an earlier attempt or a dead worker left (recovered =
--       their count) and NOTHING more: a retry re-runs what it held; else the inbox in arrival
--       order, as much of it as ARGV[7] allows; ticks = in-flight ticks
--       (recovered ones included), except
--       on a retry (in-flight work left by an earlier attempt): work holding ticks shows the
--       count its first attempt showed (shown_ticks) while the ticks that came since fold into
--       it; work holding none leaves them pending for the turn after it.
--       kind: the lane's, except that a heartbeat turn that drains items is "interactive".
--       commits, session, session_epoch, last_pass: the lane's fields as this start found them
--       (what the turn needs to know before its first write, in this one round trip; '' when
--       unset). born: when this lane's state was created in Redis (ms; set by its first start,
--       kept after), which with commits makes the work id: a lane whose Redis state was lost
--       starts counting commits from 0 again, and must not reuse the old work ids. failing:
--       the error of the lane's last try while it is failing (failures since its last
--       success), else '' (the turn checks its storage harder after a storage failure);
--       failing_since: since when (ms) it has been failing then, else ''.
-- Guarantees: at most one live lease per lane; each start bumps the fence, so a worker whose
-- lease lapsed can no longer finish; drained items stay in in-flight until finish, so a
-- crashed turn's items are recovered by the next start; a lane whose turns keep crashing is
-- dead-lettered once attempts exceed max_attempts; a started turn ends the receive claim
-- (receive.lua): from here on the lease tells whether its worker lives.
local lane, inbox, inflight, lease = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local queued, running, dead = KEYS[5], KEYS[6], KEYS[7]
local name, turn_id, worker, now = ARGV[1], ARGV[2], ARGV[3], ARGV[4]

local f = redis.call('HMGET', lane, 'state', 'turn_id', 'last_error', 'lost', 'kind',
  'commits', 'session', 'session_epoch', 'last_pass', 'born', 'failures', 'failing_since')
local state = f[1] or 'idle'
if state == 'dead' then
  return {'dead', f[3] or ''}
end
if (state ~= 'queued' and state ~= 'running') or f[2] ~= turn_id then
  return {'stale'}
end
local lost = tonumber(f[4] or '0')
if state == 'running' then
  if redis.call('EXISTS', lease) == 1 then
    return {'duplicate'}
  end
  -- The broker redelivered a turn whose worker died: that attempt was lost mid-turn.
  lost = redis.call('HINCRBY', lane, 'lost', 1)
end

local attempt = redis.call('HINCRBY', lane, 'attempts', 1)
if attempt > tonumber(ARGV[6]) then
  local err = 'worker lost mid-turn ' .. lost .. ' times'
  if f[3] and lost < attempt - 1 then
    err = err .. ' (last error: ' .. f[3] .. ')'
  end
  redis.call('HSET', lane, 'state', 'dead', 'last_error', err, 'last_error_at', now)
  redis.call('DEL', lease)
  redis.call('ZREM', queued, name)
  redis.call('ZREM', running, name)
  redis.call('ZADD', dead, now, name)
  return {'dead', err}
end

redis.call('DEL', KEYS[8])
redis.call('ZREM', KEYS[9], name)
local fence = redis.call('HINCRBY', lane, 'fence', 1)
redis.call('SET', lease, fence .. ':' .. worker, 'PX', ARGV[5])
-- What a dead worker (or a failed attempt) left in flight, then what this turn takes: the items
-- it runs, read once.
local items = redis.call('LRANGE', inflight, 0, -1)
local recovered = #items
local held = tonumber(redis.call('HGET', lane, 'inflight_ticks') or '0')
-- A retry, a redelivery or a revive re-runs exactly the work it holds: what came since waits
-- for the turn after it (finish queues it). Its request is then the one its first attempt
-- sent, so an answer already paid for is replayed from the call log, not bought again; and a
-- message the provider refuses for good dies alone, so `revive --drop-kept` drops only it,
-- not the posts a revived turn had drained beside it.
local retry = recovered > 0 or held > 0
local fresh = {}
if not retry then
  fresh = redis.call('LRANGE', inbox, 0, -1)
end
-- Bounded: a backlog whose text alone is over the turn's token budget was drained into one
-- turn that ended before its model call, and every item in it went unanswered. (A retry
-- takes nothing fresh, so no attempt of a failing turn takes another bound's worth.)
local most, taken, bytes = tonumber(ARGV[7] or '0'), #fresh, 0
if most > 0 then
  for i = 1, #fresh do
    bytes = bytes + #fresh[i]
    if bytes > most and i > 1 then
      taken = i - 1
      break
    end
  end
end
for i = 1, taken, 500 do
  redis.call('RPUSH', inflight, unpack(fresh, i, math.min(i + 499, taken)))
end
for i = 1, taken do
  items[i] = fresh[i]  -- a turn that takes fresh items recovered none
end
if taken > 0 and taken == #fresh then
  redis.call('DEL', inbox)
elseif taken > 0 then
  redis.call('LTRIM', inbox, taken, -1)
end
local pending = tonumber(redis.call('HGET', lane, 'ticks') or '0')
local ticks
if held > 0 then
  -- A retry of work that already answers ticks: those that came meanwhile fold in silently
  -- and it shows the count its first attempt showed (every tick asks the same), so it sends
  -- what that attempt sent and the turn's call log replays the answers already paid for.
  redis.call('HINCRBY', lane, 'inflight_ticks', pending)
  redis.call('HSET', lane, 'ticks', 0)
  ticks = tonumber(redis.call('HGET', lane, 'shown_ticks') or '0')
  if ticks <= 0 or ticks > held then  -- unset (a lane from before it was kept): as it stands
    ticks = held
    redis.call('HSET', lane, 'shown_ticks', ticks)
  end
elseif recovered > 0 then
  -- A retry of work that answered no tick: ticks that came meanwhile wait for the turn after
  -- it (finish queues it), so this one still sends what its first attempt sent.
  ticks = 0
else
  ticks = redis.call('HINCRBY', lane, 'inflight_ticks', pending)
  redis.call('HSET', lane, 'ticks', 0, 'shown_ticks', ticks)
end
local born = f[10] or now
redis.call('HSET', lane, 'state', 'running', 'started_at', now, 'worker', worker,
  'born', born)
redis.call('ZREM', queued, name)
redis.call('ZADD', running, tonumber(now) + tonumber(ARGV[5]), name)

-- A turn that drains inbox items is a conversation, whatever queued it: a post that arrived
-- behind a queued heartbeat must get the conversation's model and budget rules (a heartbeat
-- turn over budget is skipped, and its items with it).
local kind = f[5] or ''
if kind == 'heartbeat' and #items > 0 then
  kind = 'interactive'
  redis.call('HSET', lane, 'kind', kind)
end
local failing, failing_since = '', ''
if tonumber(f[11] or '0') > 0 then
  failing = f[3] or ''
  failing_since = f[12] or ''
end
-- The session a turn's work began in, kept for its retries: a retry re-sends what its first
-- attempt sent (the call log replays a paid answer), even after a reset (`run --new-session`)
-- that came meanwhile, whose epoch then refuses its write at finish, so the turn after it,
-- with the post that asked for the reset, is the one that starts the new session.
local session, epoch = f[7] or '', f[8] or ''
if not retry then
  redis.call('HSET', lane, 'held_session', session, 'held_epoch', epoch)
else
  local kept = redis.call('HMGET', lane, 'held_session', 'held_epoch')
  if kept[2] then
    session, epoch = kept[1] or '', kept[2]
  end
end
local reply = {'started', fence, attempt, kind, ticks, recovered,
  f[6] or '', session, epoch, f[9] or '', born, failing, failing_since}
for i = 1, #items do
  reply[#reply + 1] = items[i]
end
return reply

-- finish.lua: commit a turn (fencing-checked): clear in-flight, publish its beat and replies,
-- and queue exactly one follow-up if anything arrived while it ran.
--
-- KEYS  [1] lane hash  [2] inbox list  [3] inflight list  [4] lease  [5] lanes:queued
--       [6] lanes:running  [7] lanes:dead  (Keys.lane_keys(lane))  [8] beats stream
--       [9] claim:<lane>  [10] lanes:claimed
--       [11..] reply:<item id> lists, one per drained item that waits for a reply
-- ARGV  [1] lane name  [2] fence  [3] now (ms)  [4] status
--       [5] reply JSON {text, status, ...} WITHOUT its closing "}" (turn_id is appended here)
--       [6] last_text (<= 2000 chars)  [7] follow-up turn id (used only if one is queued)
--       [8] beats_max  [9] reply ttl (ms)  [10] n = number of beat ARGVs (0: no beat)
--       [11..10+n] beat field, value pairs (turn_id is added here, from the lane)
--       [11+n] session base (the state name the turn started from, "" for none)
--       [12+n] session epoch the turn saw  [13+n] new session state name ("": leave it)
--       [14+n] who publishes a follow-up ("" for no claim)  [15+n] its claim ttl (ms)
--       [16+n] a note on how the turn ended that an operator must act on ("": none; an
--              incomplete turn's reason), kept as last_note until a turn ends without one
-- Reply {"lost", state}: the fence is not current; NOTHING changed (state: the lane's, ''
--       when its hash is gone: a Redis that lost its data or evicted it)
--     | {"idle", turn_id, beat_id, session}
--     | {"queued", turn_id, beat_id, session, follow-up turn id, follow-up kind}
--       beat_id is "" when no beat was given; follow-up kind is "interactive" when items wait,
--       else the waiting ticks' kind ("dream" or "heartbeat"); session is "unchanged",
--       "committed", or "conflict" (a reset happened during the turn: the state is dropped).
-- Guarantees: one atomic step, so a beat is published, a reply pushed and the session state
-- made current iff the turn commits (a crashed or fenced-out turn's state file is never
-- pointed to); the beats stream stays bounded (MAXLEN ~ beats_max). A follow-up queued here
-- is claimed for its publisher, as receive.lua claims a taken message: a worker killed after
-- this commit and before its publish leaves a claim that lapses, and beat re-publishes the
-- turn within seconds (reap_claimed.lua) instead of after SOULFLEET_REAP_QUEUED_AFTER. The
-- publisher deletes the claim once the message is out (unclaim.lua).
local lane, inbox, inflight, lease = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local queued, running, beats = KEYS[5], KEYS[6], KEYS[8]
local name, fence, now = ARGV[1], ARGV[2], ARGV[3]

local f = redis.call('HMGET', lane, 'state', 'fence', 'turn_id', 'tick_kind', 'ticks')
if f[1] ~= 'running' or f[2] ~= fence then
  return {'lost', f[1] or ''}
end
local turn_id = f[3] or ''

redis.call('DEL', inflight, lease)
redis.call('HDEL', lane, 'failing_since', 'failures', 'retry_at')
-- Counts committed turns: the work a turn does keeps one id (lane:commits) across every
-- failed or crashed attempt at it, which keys its memory writes (Lanes.work_id).
redis.call('HINCRBY', lane, 'commits', 1)
redis.call('HDEL', lane, 'shown_ticks', 'held_session', 'held_epoch')
redis.call('HSET', lane, 'inflight_ticks', 0, 'attempts', 0, 'lost', 0,
           'last_turn', turn_id, 'last_status', ARGV[4], 'last_text', ARGV[6], 'last_end', now)
redis.call('ZREM', running, name)
local n = tonumber(ARGV[10])
local note = ARGV[16 + n] or ''
if note ~= '' then
  redis.call('HSET', lane, 'last_note', note)
else
  redis.call('HDEL', lane, 'last_note')
end

local beat_id = ''
if n > 0 then
  local fields = {}
  for i = 11, 10 + n do
    fields[#fields + 1] = ARGV[i]
  end
  fields[#fields + 1] = 'turn_id'
  fields[#fields + 1] = turn_id
  beat_id = redis.call('XADD', beats, 'MAXLEN', '~', ARGV[8], '*', unpack(fields))
end

local session = 'unchanged'
local s = 11 + n
if (ARGV[s + 2] or '') ~= '' then
  local current = redis.call('HMGET', lane, 'session', 'session_epoch')
  if (current[1] or '') == ARGV[s] and (current[2] or '0') == ARGV[s + 1] then
    redis.call('HSET', lane, 'session', ARGV[s + 2])
    session = 'committed'
  else
    session = 'conflict'
  end
end

if #KEYS > 10 then
  -- ARGV[5] is a JSON object missing its closing brace: the turn id is appended as a string,
  -- so a large reply is copied once and never decoded or re-encoded inside Redis.
  local payload = ARGV[5] .. ',"turn_id":"' .. turn_id .. '"}'
  for i = 11, #KEYS do
    redis.call('RPUSH', KEYS[i], payload)
    redis.call('PEXPIRE', KEYS[i], ARGV[9])
  end
end

local waiting = redis.call('LLEN', inbox)
local ticks = tonumber(f[5] or '0')
if waiting > 0 or ticks > 0 then
  local kind = 'interactive'
  if waiting == 0 then
    kind = 'heartbeat'
    if f[4] == 'dream' then kind = 'dream' end
  end
  redis.call('HSET', lane, 'state', 'queued', 'turn_id', ARGV[7], 'kind', kind,
             'queued_at', now)
  redis.call('ZADD', queued, now, name)
  local publisher = ARGV[s + 3] or ''
  if publisher ~= '' then
    redis.call('SET', KEYS[9], publisher .. '|' .. ARGV[7], 'PX', ARGV[s + 4])
    redis.call('ZADD', KEYS[10], now, name)
  end
  return {'queued', turn_id, beat_id, session, ARGV[7], kind}
end
redis.call('HSET', lane, 'state', 'idle')
redis.call('HDEL', lane, 'turn_id', 'kind', 'queued_at')
return {'idle', turn_id, beat_id, session}

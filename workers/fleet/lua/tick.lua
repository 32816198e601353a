-- tick.lua: fold timer ticks into lanes; queue a turn only for a lane that is idle.
--
-- Batched on purpose: the sweep ticks up to 100,000 lanes a second, so one call carries many
-- lanes, applied in order exactly as one call per lane would be (batching only saves round
-- trips; the compact arguments and reply save encoding and parsing).
-- KEYS  [1] lanes:queued  [2..n+1] the lane hash (Keys.lane) of each ticked lane
-- ARGV  [1] now (ms)  [2] tick kinds, one character per lane: "h" heartbeat, "d" dream
--       [3] count per lane  [4] turn id base (24 hex digits from uuid4, made in Python)
--       [5] first index  [6] length of the lane-hash key prefix (lane name = key without it)
-- Turn id of the i-th lane (from 0) = base .. 8 hex digits of (first index + i); used only if
-- that lane queues.
-- Reply one character per lane, in order:
--   "d" dead-lettered: NOTHING changed
--   "q" queued: the lane was idle; ticks += count and a turn of the tick's kind ("dream"
--       or "heartbeat") is queued with its turn id
--   "c" coalesced: a turn is already queued or running; ticks += count and nothing else,
--       so N ticks during one turn make exactly one follow-up that reports N
local queued, now, kinds, count = KEYS[1], ARGV[1], ARGV[2], ARGV[3]
local base, first, cut = ARGV[4], tonumber(ARGV[5]), tonumber(ARGV[6]) + 1
local out = {}
for i = 2, #KEYS do
  local lane = KEYS[i]
  local kind = 'heartbeat'
  if string.sub(kinds, i - 1, i - 1) == 'd' then kind = 'dream' end
  local state = redis.call('HGET', lane, 'state') or 'idle'
  if state == 'dead' then
    out[i - 1] = 'd'
  else
    redis.call('HINCRBY', lane, 'ticks', count)
    if state == 'idle' then
      local turn_id = base .. string.format('%08x', first + i - 2)
      redis.call('HSET', lane, 'tick_kind', kind, 'state', 'queued', 'turn_id', turn_id,
                 'kind', kind, 'queued_at', now)
      redis.call('ZADD', queued, now, string.sub(lane, cut))
      out[i - 1] = 'q'
    else
      redis.call('HSET', lane, 'tick_kind', kind)
      out[i - 1] = 'c'
    end
  end
end
return table.concat(out)

-- sweep_apply.lua: one claimed sweep batch's writes in one atomic step: write each member's
-- next due time (compare-and-set on the claim score) and fold a tick into the lane of each
-- member that was not skipped (as tick.lua folds it, lane by lane in order).
--
-- Why one script with one argument: a 100,000-lane sweep spent most of its time in Python
-- encoding a key per lane and parsing a reply per lane; here the lane key is built in Redis
-- from the member (Redis Cluster is not supported anyway: scripts touch fleet-wide keys).
--
-- KEYS  [1] schedule  [2] lanes:queued
-- ARGV  [1] the claim score (ms) claim.lua wrote for this batch, and no other batch
--       [2] now (ms)  [3] lane key prefix (Keys.lane(""))  [4] turn id base (24 hex digits)
--       [5] one line per claimed member, joined by "\n": "<member>\t<next due ms>\t<tick>",
--           tick "h" heartbeat, "d" dream, "-" skipped (re-scored, not ticked); a ticked
--           member is "<lane>|heartbeat" or "<lane>|dream" (keys.schedule_member)
-- Turn id of the i-th ticked line (from 0) = base .. 8 hex digits of i; used only if it queues.
-- Reply one character per TICKED line, in order (skipped lines have none):
--   "d" dead-lettered: the lane is unchanged
--   "q" queued: the lane was idle; ticks += 1, tick_kind = kind, a turn of that kind queued
--   "c" coalesced: a turn is queued or running; ticks += 1, tick_kind = kind
local schedule, queued = KEYS[1], KEYS[2]
local claimed, now, prefix, base = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
-- Compare-and-set, for the whole batch in one read: the members still at this batch's claim
-- score are exactly those nobody re-scored since (a registry sync that changed or removed
-- one, or another beat that re-claimed it after our claim timed out, wins: theirs stands).
local ours = {}
for _, member in ipairs(redis.call('ZRANGEBYSCORE', schedule, claimed, claimed)) do
  ours[member] = true
end
local out = {}
local scores = {}
local queue = {}
local ticked = 0
for member, due, tick in string.gmatch(ARGV[5], '([^\t]+)\t(%d+)\t([hd%-])\n?') do
  if ours[member] then
    scores[#scores + 1] = due
    scores[#scores + 1] = member
    if #scores >= 1000 then
      redis.call('ZADD', schedule, 'XX', unpack(scores))
      scores = {}
    end
  end
  if tick ~= '-' then
    local kind, lane = 'heartbeat', nil
    if tick == 'd' then
      kind, lane = 'dream', string.sub(member, 1, -7)
    else
      lane = string.sub(member, 1, -11)
    end
    local key = prefix .. lane
    local got = redis.call('HMGET', key, 'state', 'tick_kind', 'ticks')
    local state = got[1] or 'idle'
    if state == 'dead' then
      out[#out + 1] = 'd'
    elseif state == 'idle' then
      -- ticks += 1 in the same HSET (the script is atomic: nothing wrote ticks in between)
      redis.call('HSET', key, 'ticks', (tonumber(got[3]) or 0) + 1, 'tick_kind', kind,
                 'state', 'queued', 'turn_id', base .. string.format('%08x', ticked),
                 'kind', kind, 'queued_at', now)
      queue[#queue + 1] = now
      queue[#queue + 1] = lane
      if #queue >= 1000 then
        redis.call('ZADD', queued, unpack(queue))
        queue = {}
      end
      out[#out + 1] = 'q'
    else
      redis.call('HINCRBY', key, 'ticks', 1)
      if got[2] ~= kind then
        redis.call('HSET', key, 'tick_kind', kind)
      end
      out[#out + 1] = 'c'
    end
    ticked = ticked + 1
  end
end
if #scores > 0 then
  redis.call('ZADD', schedule, 'XX', unpack(scores))
end
if #queue > 0 then
  redis.call('ZADD', queued, unpack(queue))
end
return table.concat(out)

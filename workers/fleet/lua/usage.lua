-- usage.lua: add one model call's provider-reported tokens to its persona's day, exactly once.
--
-- KEYS  [1] usage:<day>:<persona> hash  [2] usage:top:<day> zset  [3] usage:call:<call id>
-- ARGV  [1] persona  [2] model spec  [3] turn kind  [4] input tokens  [5] output tokens
--       [6] cached input tokens  [7] cache-write input tokens  [8] keep (ms) for the day keys
--       [9] keep (ms) for the call marker
-- Reply the persona's tokens (input + output) for the day after this call; -1 when this call
--       id was already counted (a retried write): NOTHING changed.
-- Guarantees: a call is counted once however often its write is retried (the marker outlives
-- any client retry); the day hash and the top-K zset change together; both expire on their
-- own after the retention, so usage never grows without bound.
local day, top, marker = KEYS[1], KEYS[2], KEYS[3]
local persona, model, kind = ARGV[1], ARGV[2], ARGV[3]
local input, output = tonumber(ARGV[4]), tonumber(ARGV[5])
local cached, written = tonumber(ARGV[6]), tonumber(ARGV[7])

-- Checked before the first write: a script that fails half-way keeps what it wrote (the marker
-- set and some counters added), so the call's retry would count nothing.
for i = 4, 7 do
  local n = tonumber(ARGV[i])
  if not n or n < 0 or n > 1e12 or n ~= math.floor(n) then
    return redis.error_reply('usage.lua: ARGV[' .. i .. '] is not a token count: ' .. ARGV[i])
  end
end

if not redis.call('SET', marker, '1', 'NX', 'PX', ARGV[9]) then
  return -1
end
local tokens = input + output
redis.call('HINCRBY', day, 'input', input)
redis.call('HINCRBY', day, 'output', output)
redis.call('HINCRBY', day, 'cached', cached)
redis.call('HINCRBY', day, 'cache_write', written)
redis.call('HINCRBY', day, 'calls', 1)
redis.call('HINCRBY', day, 'input|' .. model, input)
redis.call('HINCRBY', day, 'output|' .. model, output)
redis.call('HINCRBY', day, 'cached|' .. model, cached)
redis.call('HINCRBY', day, 'calls|' .. model, 1)
redis.call('HINCRBY', day, 'calls@' .. kind, 1)
redis.call('HINCRBY', day, 'tokens@' .. kind, tokens)
local total = redis.call('HINCRBY', day, 'tokens', tokens)
redis.call('ZADD', top, total, persona)
redis.call('PEXPIRE', day, ARGV[8])
redis.call('PEXPIRE', top, ARGV[8])
return total

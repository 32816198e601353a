-- breaker_record.lua: count one finished call to a provider; open or close its breaker.
--
-- KEYS  [1] breaker:<provider>  [2] breakers (set of providers with a breaker record)
-- ARGV  [1] provider  [2] now (ms)  [3] "ok" | "fail"  [4] window (ms)  [5] min calls
--       [6] failure ratio (0..1]  [7] probe interval (ms)  [8] error text (fail only)
--       [9] "probe" when the call was the breaker's probe (else "")
-- Reply "opened" | "closed_now" (a call succeeded while open: the provider is back)
--     | "open" | "closed"
-- The window is a sliding-window counter: this window's counts plus the previous window's,
-- weighted by how much of it still overlaps (two numbers, no per-call state). The breaker
-- opens when a failure lands while at least min_calls calls in the window failed at least
-- ratio of the time; while open, each failed probe pushes the next probe one interval on and
-- frees the probe slot; a failure of another call (one that started before the breaker
-- opened) leaves both alone, so no second probe goes while the first is still running.
local key = KEYS[1]
local now, ok, window = tonumber(ARGV[2]), ARGV[3] == 'ok', tonumber(ARGV[4])
redis.call('SADD', KEYS[2], ARGV[1])
redis.call('HINCRBY', key, 'calls_total', 1)
if not ok then
  redis.call('HINCRBY', key, 'failures_total', 1)
end
local f = redis.call('HMGET', key, 'state', 'win_start', 'win_calls', 'win_fails',
                     'prev_calls', 'prev_fails')
local start = tonumber(f[2] or '0')
local calls, fails = tonumber(f[3] or '0'), tonumber(f[4] or '0')
local prev_calls, prev_fails = tonumber(f[5] or '0'), tonumber(f[6] or '0')
if now - start >= window then
  if now - start >= 2 * window then
    prev_calls, prev_fails = 0, 0
  else
    prev_calls, prev_fails = calls, fails
  end
  start, calls, fails = now, 0, 0
end
calls = calls + 1
if not ok then fails = fails + 1 end
redis.call('HSET', key, 'win_start', start, 'win_calls', calls, 'win_fails', fails,
           'prev_calls', prev_calls, 'prev_fails', prev_fails)

if f[1] == 'open' then
  if ok then
    redis.call('HSET', key, 'state', 'closed', 'closed_at', now, 'win_start', now,
               'win_calls', 0, 'win_fails', 0, 'prev_calls', 0, 'prev_fails', 0)
    redis.call('HDEL', key, 'probe_until', 'probe_at', 'probe_lane')
    return 'closed_now'
  end
  if ARGV[9] == 'probe' then
    redis.call('HSET', key, 'probe_at', now + tonumber(ARGV[7]), 'probe_until', 0,
               'last_error', ARGV[8])
    redis.call('HDEL', key, 'probe_lane')
  else
    redis.call('HSET', key, 'last_error', ARGV[8])
  end
  return 'open'
end
if ok then
  return 'closed'
end
local weight = 1 - (now - start) / window
local seen = calls + prev_calls * weight
local failed = fails + prev_fails * weight
if seen >= tonumber(ARGV[5]) and failed >= tonumber(ARGV[6]) * seen then
  redis.call('HSET', key, 'state', 'open', 'opened_at', now, 'probe_at',
             now + tonumber(ARGV[7]), 'probe_until', 0, 'last_error', ARGV[8])
  redis.call('HINCRBY', key, 'opened_total', 1)
  return 'opened'
end
return 'closed'

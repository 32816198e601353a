-- hash_fields.lua: read one field from each of many hashes in one call.
--
-- The sweep reads a stored spec (canonical JSON: never a raw newline) per member it has not
-- seen, and its spend checks a budget, a last post or a last dream pass per due lane; as
-- pipelined HGETs, 100,000 lanes cost more in client-side encoding and reply parsing than in
-- Redis. One argument in, one string out.
--
-- KEYS  none (the hashes are named in ARGV: one key per read would cost more to send)
-- ARGV  [1] one line per read, joined by "\n": "<hash key>\t<field>"
-- Reply the values joined by "\n", in order ("" for a missing hash or field). Values must not
--       contain "\n" (the sweep reads integers and JSON specs only).
local values = {}
for key, field in string.gmatch(ARGV[1], '([^\t\n]+)\t([^\t\n]+)') do
  values[#values + 1] = redis.call('HGET', key, field) or ''
end
return table.concat(values, '\n')

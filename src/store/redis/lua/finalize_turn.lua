-- ARGV: 1 numbers packed '>dddddd': now, session ttl ms, the answer's
--       counts a, s, l, max_turns; 2 turn id, 3 final answer, 4 encoding
--       letter of its counts
-- Returns {'ok', record} | {'already', record} | {'not_found'}
local now, session_ttl, a, s, l, max_turns = struct.unpack('>dddddd', ARGV[1])
local tid = ARGV[2]
local got = redis.call('HMGET', KEYS[2], tid, tid .. 't')
local rec = got[1]
if not rec then return {'not_found'} end
if not is_pending(rec) then
  local qb = tonumber(string.match(rec, '^%d+ %d+ %d+ %S+ (%d+)\n'))
  local nl = string.find(rec, '\n', 1, true)
  local ab = #rec - nl - math.min(qb, HEAD)
  if got[2] then ab = ab + #got[2] - math.max(qb - HEAD, 0) end
  return {'already', assemble(rec, got[2], qb, ab, qb, ab)}
end
local deadline = redis.call('ZSCORE', KEYS[3], tid)
if not (deadline and tonumber(deadline) > now) then return {'not_found'} end

local seq, started, key, qe, q, u, body =
  string.match(rec, '^%?(%d+) (%d+) (%S+) (%a) (%d+) (%d+)\n()')
local query = string.sub(rec, body)
local answer = ARGV[3]
local header = seq .. ' ' .. started .. ' ' .. string.format('%d', now) .. ' ' .. key .. ' ' .. #query
local member = tid .. struct.pack(COSTS, qe, ARGV[4], tonumber(q), tonumber(u), a, s, l, #query, #answer)
local head, tail = split(header, query, answer)
if tail then
  redis.call('HSET', KEYS[2], tid, head, tid .. 't', tail)
else
  redis.call('HSET', KEYS[2], tid, head)
end
redis.call('ZREM', KEYS[3], tid)
redis.call('ZADD', KEYS[3], seq, member)

local meta = redis.call('HMGET', KEYS[1], 'n', 'keyed')
local count = tonumber(meta[1] or '0') + 1
local excess = count - max_turns
if excess > 0 then
  -- The lowest scores are the oldest finalized turns.
  local old = redis.call('ZPOPMIN', KEYS[3], math.min(excess, TRIM))
  local ids = {}
  for i = 1, #old, 2 do ids[#ids + 1] = string.sub(old[i], 1, ID) end
  forget(ids, meta[2])
  count = count - #ids
end
redis.call('HSET', KEYS[1], 'last_active_at', now, 'n', count)
touch(session_ttl)
return {'ok', header .. '\n' .. query .. answer}

-- ARGV: 1 numbers packed '>ddddddddd': now, session ttl ms, the answer's
--       counts a, s, l, max_turns, its English copy's counts a, s, l (0
--       without one); 2 turn id, 3 final answer, 4 encoding letter of its
--       counts, 5 the answer's English copy or ''
-- Returns {'ok', record without its answer (the caller has it), English
--         copies or false} |
--         {'already', record, English copies or false} | {'not_found'}
local now, session_ttl, a, s, l, max_turns, ea, es, el =
  struct.unpack('>ddddddddd', ARGV[1])
local tid = ARGV[2]
local got = redis.call('HMGET', KEYS[2], tid, tid .. 't', tid .. 'e')
local rec = got[1]
if not rec then return {'not_found'} end
if not is_pending(rec) then
  local qb = tonumber(string.match(rec, '^%d+ %d+ %d+ %S+ (%d+)\n'))
  local nl = string.find(rec, '\n', 1, true)
  local ab = #rec - nl - math.min(qb, HEAD)
  if got[2] then ab = ab + #got[2] - math.max(qb - HEAD, 0) end
  return {'already', assemble(rec, got[2], qb, ab, qb, ab), got[3] or false}
end
local deadline = redis.call('ZSCORE', KEYS[3], tid)
if not (deadline and tonumber(deadline) > now) then return {'not_found'} end

local seq, started, key, qe, q, u, body =
  string.match(rec, '^%?(%d+) (%d+) (%S+) (%a) (%d+) (%d+)\n()')
local query = string.sub(rec, body)
local answer = ARGV[3]
local header = seq .. ' ' .. started .. ' ' .. string.format('%d', now) .. ' ' .. key .. ' ' .. #query
local member = tid .. struct.pack(COSTS, qe, ARGV[4], tonumber(q), tonumber(u), a, s, l, #query, #answer)

-- English copies: the question's was kept at start, the answer's comes now.
local query_en, eq, eu = false, tonumber(q), tonumber(u)
if got[3] then
  local cq, cu, at = string.match(got[3], '^(%d+) (%d+)\n()')
  query_en, eq, eu = string.sub(got[3], at), tonumber(cq), tonumber(cu)
end
local english
member, english = with_english(member, query, answer, query_en, eq, eu, a, s, l, ARGV[5], ea, es, el)

write_finalized(tid, header, query, answer, english)
redis.call('HDEL', KEYS[2], tid .. 'p')
redis.call('ZREM', KEYS[3], tid)
redis.call('ZADD', KEYS[3], seq, member)

local meta = redis.call('HMGET', KEYS[1], 'n', 'keyed', 'ts', 'cs', 'st')
local sums = {meta[3], meta[4], meta[5]}
local count = tonumber(meta[1] or '0') + 1
tally({member, seq}, 1, count, sums)
local excess = excess_turns(count, max_turns)
if excess > 0 then
  -- The lowest scores are the oldest finalized turns.
  local old = redis.call('ZPOPMIN', KEYS[3], math.min(excess, TRIM))
  local ids = {}
  for i = 1, #old, 2 do ids[#ids + 1] = string.sub(old[i], 1, ID) end
  forget(ids, meta[2])
  count = count - #ids
  tally(old, -1, count, sums)
end
if sums.cs_changed then
  redis.call('HSET', KEYS[1], 'last_active_at', now, 'n', count, 'ts', sums[1], 'cs', sums[2])
else
  redis.call('HSET', KEYS[1], 'last_active_at', now, 'n', count, 'ts', sums[1])
end
touch(session_ttl)
return {'ok', header .. '\n' .. query, english}

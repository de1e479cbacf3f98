-- Replaces the answer of a finalized turn no summary covers, keeping its
-- seq, question and question's English copy; the old answer (and its
-- English copy) is not kept. ARGV as finalize_turn.lua's: 1 numbers
-- packed '>ddddddddd': now, session ttl ms, the answer's counts a, s, l,
-- max_turns (unused: the count does not change), its English copy's
-- counts a, s, l (0 without one); 2 turn id, 3 the answer, 4 encoding
-- letter of its counts, 5 the answer's English copy or ''.
-- Returns {'ok', record without its answer (the caller has it), English
--         copies or false} | {'not_found'} | {'pending'} |
--         {'summarized', the seq the summary covers up to}
local now, session_ttl, a, s, l, _, ea, es, el = struct.unpack('>ddddddddd', ARGV[1])
local tid = ARGV[2]
local got = redis.call('HMGET', KEYS[2], tid, tid .. 't', tid .. 'e')
local rec = got[1]
if not rec then return {'not_found'} end
if is_pending(rec) then
  local deadline = redis.call('ZSCORE', KEYS[3], tid)
  if deadline and tonumber(deadline) > now then return {'pending'} end
  return {'not_found'}
end
local seq, started, key, qb, nl = string.match(rec, '^(%d+) (%d+) %d+ (%S+) (%d+)\n()')
qb = tonumber(qb)
local covered = redis.call('HGET', KEYS[1], 'st')
if covered and tonumber(seq) <= tonumber(covered) then return {'summarized', tonumber(covered)} end

-- The question, from the head and (past HEAD bytes) the tail.
local query = string.sub(rec, nl, nl + math.min(qb, HEAD) - 1)
if qb > HEAD then query = query .. string.sub(got[2], 1, qb - HEAD) end
local old = redis.call('ZRANGEBYSCORE', KEYS[3], seq, seq)[1]
if not old or string.sub(old, 1, ID) ~= tid then return {'not_found'} end
local qe, _, q, u = struct.unpack('>c1c1I4I4', old, ID + 1)

local answer = ARGV[3]
local header = seq .. ' ' .. started .. ' ' .. string.format('%d', now) .. ' ' .. key .. ' ' .. #query
local member = tid .. struct.pack(COSTS, qe, ARGV[4], q, u, a, s, l, #query, #answer)

-- English copies: the question's stays, the answer's is the new one's.
local query_en, eq, eu = false, q, u
if got[3] and #old > BASE then
  local flags, cq, cu = struct.unpack('>BI4I4', old, BASE + 1)
  if flags % 2 == 1 then
    local qlen, at = string.match(got[3], '^(%d+) %S+\n()')
    query_en, eq, eu = string.sub(got[3], at, at + tonumber(qlen) - 1), cq, cu
  end
end
local english
member, english = with_english(member, query, answer, query_en, eq, eu, a, s, l, ARGV[5], ea, es, el)

local tail = write_finalized(tid, header, query, answer, english)
local gone = {}
if got[2] and not tail then gone[#gone + 1] = tid .. 't' end
if got[3] and not english then gone[#gone + 1] = tid .. 'e' end
if #gone > 0 then redis.call('HDEL', KEYS[2], unpack(gone)) end
redis.call('ZREM', KEYS[3], old)
redis.call('ZADD', KEYS[3], seq, member)

local meta = redis.call('HMGET', KEYS[1], 'n', 'ts', 'cs', 'st')
local sums = {meta[2], meta[3], meta[4]}
local count = tonumber(meta[1] or '0')
tally({old, seq}, -1, count, sums)
tally({member, seq}, 1, count, sums)
redis.call('HSET', KEYS[1], 'last_active_at', now, 'ts', sums[1])
touch(session_ttl)
return {'ok', header .. '\n' .. query, english}

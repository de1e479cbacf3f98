-- ARGV: 1 numbers packed '>dddddd': now, session ttl ms, the answer's
--       counts a, s, l, max_turns; 2 turn id, 3 final answer, 4 encoding
--       letter of its counts
-- Returns {'ok', record} | {'already', record} | {'not_found'}
local now, session_ttl, a, s, l, max_turns = struct.unpack('>dddddd', ARGV[1])
local tid = ARGV[2]
local rec = redis.call('HGET', KEYS[2], tid)
if not rec then return {'not_found'} end
if not is_pending(rec) then return {'already', rec} end
local deadline = redis.call('ZSCORE', KEYS[3], tid)
if not (deadline and tonumber(deadline) > now) then return {'not_found'} end

local seq, started, key, qe, q, u, body =
  string.match(rec, '^%?(%d+) (%d+) (%S+) (%a) (%d+) (%d+)\n()')
local query = string.sub(rec, body)
local answer = ARGV[3]
local done = seq .. ' ' .. started .. ' ' .. string.format('%d', now) .. ' ' .. key .. ' ' .. #query
  .. '\n' .. query .. answer
local member = tid .. struct.pack(COSTS, qe, ARGV[4], tonumber(q), tonumber(u), a, s, l, #query, #answer)
redis.call('HSET', KEYS[2], tid, done)
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
return {'ok', done}

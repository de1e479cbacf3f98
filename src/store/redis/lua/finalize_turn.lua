-- ARGV: 1 now, 2 session ttl ms, 3 turn id, 4 final answer,
--       5 encoding letter of its counts, 6 a, 7 s, 8 l, 9 max_turns
-- Returns {'ok', record, pending turns purged} | {'already', record} | {'not_found'}
local now = tonumber(ARGV[1])
local tid = ARGV[3]
local done = redis.call('HGET', KEYS[2], tid)
if done then return {'already', done} end
local deadline = redis.call('ZSCORE', KEYS[5], tid)
if not (deadline and tonumber(deadline) > now) then return {'not_found'} end
local pending = redis.call('HGET', KEYS[4], tid)
if not pending then return {'not_found'} end

local seq, started, key, qe, q, u, body =
  string.match(pending, '^(%d+) (%d+) (%S+) (%a) (%d+) (%d+)\n()')
local query = string.sub(pending, body)
local answer = ARGV[4]
local rec = seq .. ' ' .. started .. ' ' .. ARGV[1] .. ' ' .. key .. ' ' .. #query .. '\n' .. query .. answer
local member = tid .. struct.pack(COSTS, qe, ARGV[5], tonumber(q), tonumber(u),
  tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8]), #query, #answer)
redis.call('HSET', KEYS[2], tid, rec)
redis.call('ZADD', KEYS[3], seq, member)
redis.call('HDEL', KEYS[4], tid)
redis.call('ZREM', KEYS[5], tid)

local excess = redis.call('ZCARD', KEYS[3]) - tonumber(ARGV[9])
if excess > 0 then
  local old = redis.call('ZPOPMIN', KEYS[3], math.min(excess, TRIM))
  -- Only a session with idempotency keys needs the records read.
  local keyed = redis.call('HLEN', KEYS[6]) > 0
  for i = 1, #old, 2 do
    local id = string.sub(old[i], 1, ID)
    if keyed then
      local r = redis.call('HGET', KEYS[2], id)
      if r then drop_key(key_of(r, 4), id) end
    end
    redis.call('HDEL', KEYS[2], id)
  end
end
redis.call('HSET', KEYS[1], 'last_active_at', ARGV[1])
local expired = purge_pending(now)
touch(ARGV[2])
return {'ok', rec, expired}

-- ARGV: 1 now, 2 session ttl ms, 3 turn_id, 4 finalization JSON, 5 max_turns
-- Returns {'ok', turn JSON, expired} | {'already', turn JSON} | {'not_found'}
local now = tonumber(ARGV[1])
local tid = ARGV[3]
local done = redis.call('HGET', KEYS[2], tid)
if done then return {'already', done} end
local rec = false
local deadline = redis.call('ZSCORE', KEYS[5], tid)
if deadline and tonumber(deadline) > now then rec = redis.call('HGET', KEYS[4], tid) end
if not rec then return {'not_found'} end

local full = '{"p":' .. rec .. ',"f":' .. ARGV[4] .. '}'
redis.call('HSET', KEYS[2], tid, full)
redis.call('ZADD', KEYS[3], seq_of(rec), tid)
redis.call('HDEL', KEYS[4], tid)
redis.call('ZREM', KEYS[5], tid)

local excess = redis.call('ZCARD', KEYS[3]) - tonumber(ARGV[5])
if excess > 0 then
  local old = redis.call('ZPOPMIN', KEYS[3], excess)
  -- Only a session with idempotency keys needs the records read.
  local keyed = redis.call('HLEN', KEYS[6]) > 0
  for i = 1, #old, 2 do
    if keyed then
      local r = redis.call('HGET', KEYS[2], old[i])
      if r then drop_key(idem_key_of(r), old[i]) end
    end
    redis.call('HDEL', KEYS[2], old[i])
  end
end
redis.call('HSET', KEYS[1], 'last_active_at', ARGV[1])
local expired = purge_pending(now)
touch(ARGV[2])
return {'ok', full, expired}

-- ARGV: 1 now, 2 turn id. Returns 'pending' | 'finalized' | 'not_found'
local now = tonumber(ARGV[1])
local tid = ARGV[2]
local deadline = redis.call('ZSCORE', KEYS[5], tid)
if deadline then
  local rec = redis.call('HGET', KEYS[4], tid)
  redis.call('HDEL', KEYS[4], tid)
  redis.call('ZREM', KEYS[5], tid)
  if rec then drop_key(key_of(rec, 3), tid) end
  if rec and tonumber(deadline) > now then return 'pending' end
end
local rec = redis.call('HGET', KEYS[2], tid)
if rec then
  drop_key(key_of(rec, 4), tid)
  redis.call('HDEL', KEYS[2], tid)
  local seq = string.match(rec, '^(%d+)')
  redis.call('ZREMRANGEBYSCORE', KEYS[3], seq, seq)
  return 'finalized'
end
return 'not_found'

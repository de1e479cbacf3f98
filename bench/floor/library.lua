#!lua name=floor
-- The floor of issue 20: allocate a seq, append, read the newest 20
-- records, slide TTLs; then store the answer and slide TTLs. No pending
-- cap, idempotency, budget, counts, summaries or index.
local function start(KEYS, ARGV)
  local seq = redis.call('HINCRBY', KEYS[1], 'next_seq', 1)
  redis.call('HSET', KEYS[2], ARGV[3], ARGV[4])
  redis.call('ZADD', KEYS[3], seq, ARGV[3])
  local ids = redis.call('ZREVRANGE', KEYS[3], 1, 20)
  local recs = {}
  if #ids > 0 then recs = redis.call('HMGET', KEYS[2], unpack(ids)) end
  for i = 1, 3 do redis.call('PEXPIRE', KEYS[i], 604800000) end
  return {'ok', seq, recs}
end
local function finalize(KEYS, ARGV)
  redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
  for i = 1, 3 do redis.call('PEXPIRE', KEYS[i], 604800000) end
  return {'ok'}
end
redis.register_function('floor_start', start)
redis.register_function('floor_finalize', finalize)

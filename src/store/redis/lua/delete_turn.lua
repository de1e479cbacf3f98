-- ARGV: 1 now, 2 turn id. Returns 'pending' | 'finalized' | 'not_found'
-- (an expired pending turn is removed, and not found).
local tid = ARGV[2]
local rec = redis.call('HGET', KEYS[2], tid)
if not rec then return 'not_found' end
drop_key(key_of(rec), tid)
redis.call('HDEL', KEYS[2], tid, tid .. 't', tid .. 'e', tid .. 'p')
if is_pending(rec) then
  local deadline = redis.call('ZSCORE', KEYS[3], tid)
  redis.call('ZREM', KEYS[3], tid)
  if deadline and tonumber(deadline) > tonumber(ARGV[1]) then return 'pending' end
  return 'not_found'
end
local seq = string.match(rec, '^(%d+)')
local members = redis.call('ZRANGEBYSCORE', KEYS[3], seq, seq)
-- A record without its turn: trimmed by an import, not freed yet.
if not (members[1] and string.sub(members[1], 1, ID) == tid) then return 'not_found' end
redis.call('ZREMRANGEBYSCORE', KEYS[3], seq, seq)
local left = redis.call('HINCRBY', KEYS[1], 'n', -1)
if members[1] then tally({members[1], seq}, -1, left) end
return 'finalized'

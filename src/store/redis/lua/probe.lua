-- For a listing, about the index entry (ARGV[1] user, ARGV[2] its time):
-- ARGV: 3 fence ttl ms.
-- Returns {1, last_active_at, turn_count} when the user owns the session;
-- otherwise the entry is stale: fences it (see fence) and returns {0}.
local m = redis.call('HMGET', KEYS[1], 'user_id', 'last_active_at', 'created_at')
if m[1] == ARGV[1] then
  return {1, m[2] or m[3], finalized_count()}
end
fence(ARGV[1], ARGV[2], ARGV[3])
return {0}

-- For an erasure, about the index entry (ARGV[1] user, ARGV[2] its time):
-- ARGV: 3 fence ttl ms.
-- Deletes the session if the user owns it, and fences the entry (see
-- fence) so that it can be removed. Returns 1 if it deleted the session.
local deleted = 0
if redis.call('HGET', KEYS[1], 'user_id') == ARGV[1] then
  redis.call('UNLINK', KEYS[1], KEYS[2], KEYS[3])
  deleted = 1
end
fence(ARGV[1], ARGV[2], ARGV[3])
return deleted

-- Deletes the session's keys (UNLINK: a large session is freed in the
-- background). Returns its owner or ''.
local owner = redis.call('HGET', KEYS[1], 'user_id') or ''
redis.call('UNLINK', KEYS[1], KEYS[2], KEYS[3])
return owner

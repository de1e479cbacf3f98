-- For an erasure: KEYS, each session's five keys (h, r, s, f, l) in turn (one
-- session a call on a cluster, as the keys of one call share a slot; many
-- on a single Redis). ARGV: 1 user, 2 fence ttl ms, then each session's
-- index entry's time.
-- Deletes each session the user owns, and fences each entry (see fence)
-- so that it can be removed. Returns 1 or 0 a session: deleted or not.
local out = {}
for i = 1, #KEYS / 5 do
  local h = KEYS[5 * i - 4]
  out[i] = 0
  if redis.call('HGET', h, 'user_id') == ARGV[1] then
    redis.call('UNLINK', h, KEYS[5 * i - 3], KEYS[5 * i - 2])
    out[i] = 1
  end
  fence(KEYS[5 * i - 1], ARGV[2 + i], ARGV[2])
end
return out

-- For a listing: KEYS, each session's five keys (h, r, s, f, l) in turn, as
-- for erase_sessions.lua. ARGV: 1 user, 2 fence ttl ms, then each
-- session's index entry's time.
-- Returns one reply a session: {1, last_active_at, turn_count} when the
-- user owns it; otherwise the entry is stale: fences it (see fence), {0}.
local out = {}
for i = 1, #KEYS / 5 do
  local m = redis.call('HMGET', KEYS[5 * i - 4], 'user_id', 'last_active_at', 'created_at', 'n')
  if m[1] == ARGV[1] then
    out[i] = {1, m[2] or m[3], m[4] or 0}
  else
    fence(KEYS[5 * i - 1], ARGV[2 + i], ARGV[2])
    out[i] = {0}
  end
end
return out

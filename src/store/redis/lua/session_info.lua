-- Read-only. ARGV: 1 now
-- Returns false | {owner or '', created_at, last_active_at, turn_count,
--   pending_count, pttl, generation}
local m = redis.call('HMGET', KEYS[1], 'user_id', 'created_at', 'last_active_at', 'n', 'g')
if not m[2] then return false end
return {m[1] or '', m[2], m[3] or m[2], m[4] or 0,
        live_pending(tonumber(ARGV[1])), redis.call('PTTL', KEYS[1]), generation(m[5], m[2])}

-- Read-only. ARGV: 1 now, walk arguments from 2 (see common.lua).
-- Returns false (no session) | {owner or '', live pending turns, page}
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
local owner = redis.call('HGET', KEYS[1], 'user_id') or ''
return {owner, live_pending(tonumber(ARGV[1])), walk(walk_args(2, nil))}

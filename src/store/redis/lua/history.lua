-- Read-only. ARGV: 1 now, walk arguments from 2 (see walk.lua).
-- Returns false (no session) | {owner or '', live pending turns, page,
--   generation}
local m = redis.call('HMGET', KEYS[1], 'user_id', 'next_seq', 'n', 'g', 'created_at', 'st', 'sh')
if not m[2] then return false end
local now = tonumber(ARGV[1])
local pending = live_pending(now)
return {m[1] or '', pending, walk(2, nil, tonumber(m[3] or '0'), now, {m[6], m[7]}, pending == 0),
  generation(m[4], m[5])}

-- Read-only. ARGV: 1 now, 2 limit, 3 keep_first '1'/'0'
-- Returns false (no session) | {owner, {total, newest first, first}, live pending}
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
local owner = redis.call('HGET', KEYS[1], 'user_id') or ''
local h = read_history('+inf', tonumber(ARGV[2]), ARGV[3] == '1')
return {owner, h, live_pending(tonumber(ARGV[1]))}

-- Read-only. Returns false | {summary, through seq, SUMMARY header}.
local m = redis.call('HMGET', KEYS[1], 'sm', 'st', 'sh')
if not m[1] then return false end
return {m[1], m[2], m[3]}

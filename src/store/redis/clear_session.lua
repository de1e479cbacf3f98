-- ARGV: 1 owner required ('' for any). Returns {deleted 1/0, owner}
local owner = redis.call('HGET', KEYS[1], 'user_id') or ''
if ARGV[1] ~= '' and owner ~= ARGV[1] then return {0, owner} end
local existed = redis.call('EXISTS', KEYS[1])
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6])
return {existed, owner}

-- Makes a fork's staged copy the new session, at once: its turns and
-- records renamed into place, its meta written (owner, generation, counts
-- and sums, the copied summary, the idempotency key's record). KEYS 1-5
-- the new session's, 6-8 its staging (fork_write.lua).
-- ARGV: 1 numbers packed '>ddddd': now, session ttl ms, index needed ms,
-- time of the index entry the caller wrote (0: none), the fork's through
-- seq (the next start takes the seq after it); 2 the attempt's token;
-- 3 owner or ''; 4 user the caller wrote an index entry for, or ''; 5
-- idempotency key or ''; 6 what the key's record says (see fork.rs); 7
-- the generation (a new turn id); 8 summary text or ''; 9 its header; 10
-- the seq it covers to.
-- Returns {'ok', 0} | {'exists', the key's record or '', its owner or ''} |
--   {'lost'} |
--   {'need_index', user, min time}
local now, ttl, needed, written, through = struct.unpack('>ddddd', ARGV[1])
local token, owner, indexed_for, key, made = ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local there = redis.call('HMGET', KEYS[1], 'created_at', 'ft', 'k:' .. key, 'user_id')
if there[1] then
  -- This very call again (its reply was lost): done.
  if there[2] == token then return {'ok', 0} end
  return {'exists', key ~= '' and there[3] or '', there[4] or ''}
end
local staged = redis.call('HMGET', KEYS[8], 'token', 'n', 'ts', 'cs')
if staged[1] ~= token then return {'lost'} end

if owner ~= '' then
  if indexed_for == owner then
    local since = fenced(KEYS[4])
    if since >= written then return {'need_index', owner, since} end
  else
    return {'need_index', owner, 0}
  end
end

for i = 6, 7 do
  if redis.call('EXISTS', KEYS[i]) == 1 then redis.call('RENAME', KEYS[i], KEYS[i - 4]) end
end
local fields = {'created_at', now, 'last_active_at', now, 'next_seq', string.format('%d', through),
  'n', staged[2], 'g', ARGV[7], 'ft', token}
local function set(f, v)
  fields[#fields + 1] = f
  fields[#fields + 1] = v
end
if staged[3] then set('ts', staged[3]) end
if staged[4] then set('cs', staged[4]) end
if ARGV[8] ~= '' then
  set('sm', ARGV[8])
  set('sh', ARGV[9])
  set('st', ARGV[10])
end
if owner ~= '' then
  set('user_id', owner)
  set('ix', written)
  set('ia', now)
end
if key ~= '' then
  set('k:' .. key, made)
  set('keyed', '1')
end
redis.call('HSET', KEYS[1], unpack(fields))
redis.call('DEL', KEYS[8])
touch(ttl)
return {'ok', 0}

-- Writes the session's summary. ARGV: 1 numbers packed '>dddddd': now,
-- session ttl ms, through seq, expected through seq (-1: not given), index
-- needed ms, time of the index entry the caller wrote (0: none); 2 user_id
-- or '', 3 the summary, 4 its counts "<letter> <text> <alone> <joined>
-- <message>", 5 user the caller wrote an index entry for, or '', 6 the
-- generation the writer read (see generation) or '' (any).
-- Returns {'ok'} | {'replaced'} (not the generation the writer read: the
--   session was cleared or erased since, perhaps started again) |
--   {'owner_mismatch'} | {'conflict', stored through seq} |
--   {'beyond', newest finalized seq} | {'pending', seq of the oldest
--   pending turn, which the summary may not cover} | {'need_index', user,
--   min time}
local now, ttl, through, expected, needed, written = struct.unpack('>dddddd', ARGV[1])
local user, text, counts, indexed_for, read = ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local m = redis.call('HMGET', KEYS[1], 'user_id', 'ix', 'next_seq', 'st', 'g', 'created_at')
if read ~= '' and (not m[3] or generation(m[5], m[6]) ~= read) then return {'replaced'} end
if not m[3] then return {'beyond', 0} end
local owner = m[1]
if owner == '' then owner = false end
if access(owner, user) == 'mismatch' then return {'owner_mismatch'} end
local stored = tonumber(m[4] or '0')
local newest = redis.call('ZREVRANGEBYSCORE', KEYS[3], '(' .. LIVE, '-inf', 'WITHSCORES', 'LIMIT', 0, 1)
local refused = summary_check(stored, expected, through, tonumber(newest[2] or '0'), oldest_pending(now))
if refused then return refused end
-- The session lives on: its owner's index entry must reach as far.
if owner then
  if indexed_for == owner then
    local since = fenced(KEYS[4])
    if since >= written then return {'need_index', owner, since} end
    redis.call('HSET', KEYS[1], 'ix', written)
  elseif index_due(false, tonumber(m[2] or '0'), now, needed) then
    return {'need_index', owner, 0}
  end
end
if through > stored then cover(stored, through) end
redis.call('HSET', KEYS[1], 'st', through, 'sm', text,
  'sh', string.format('%d', now) .. ' ' .. counts .. ' ' .. #text)
touch(ttl)
return {'ok'}

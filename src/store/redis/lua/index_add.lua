-- A user's index. KEYS[1]: zset of the user's sessions, each scored by the
-- time (ms) its entry reaches until: past the latest its session can
-- expire, so an entry whose time is past is a dead session's.
-- ARGV: 1 session, 2 now, 3 reach (the time the entry must reach: now +
--       the index horizon), 4 min time (0: none), 5 skew ms, 6 'xx' to
--       move an entry only if there is one (see activity in common.lua:
--       an entry removed meanwhile stays removed), or ''
-- Writes the entry at reach, but past every other entry (times are unique
-- per user: listings page by time) and past min (a fence).
-- Drops a few entries long past, and keeps the key as long as its newest
-- entry. Returns the entry's time (0: 'xx' and none).
local top = redis.call('ZREVRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if ARGV[6] == 'xx' then
  if top[1] == ARGV[1] then return tonumber(top[2]) end
  if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then return 0 end
end
local now = tonumber(ARGV[2])
local t = index_time(tonumber(ARGV[3]), tonumber(top[2]), tonumber(ARGV[4]))
redis.call('ZADD', KEYS[1], t, ARGV[1])
local old = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. (now - tonumber(ARGV[5])), 'LIMIT', 0, 32)
if #old > 0 then redis.call('ZREM', KEYS[1], unpack(old)) end
redis.call('PEXPIRE', KEYS[1], t - now + tonumber(ARGV[5]))
return t

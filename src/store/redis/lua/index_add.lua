-- A user's index. KEYS[1]: zset of the user's sessions, each scored by the
-- time (ms) its entry reaches until: past the latest its session can
-- expire, so an entry whose time is past is a dead session's.
-- ARGV: 1 session, 2 now, 3 reach (the time the entry must reach: now +
--       the index horizon), 4 min time (0: none), 5 skew ms
-- Writes the entry at reach, but past every other entry (times are unique
-- per user: listings page by time) and past min (a fence).
-- Drops a few entries long past, and keeps the key as long as its newest
-- entry. Returns the entry's time.
local now = tonumber(ARGV[2])
local t = tonumber(ARGV[3])
local top = redis.call('ZREVRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if top[2] and tonumber(top[2]) + 1 > t then t = tonumber(top[2]) + 1 end
if tonumber(ARGV[4]) + 1 > t then t = tonumber(ARGV[4]) + 1 end
redis.call('ZADD', KEYS[1], t, ARGV[1])
local old = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. (now - tonumber(ARGV[5])), 'LIMIT', 0, 32)
if #old > 0 then redis.call('ZREM', KEYS[1], unpack(old)) end
redis.call('PEXPIRE', KEYS[1], t - now + tonumber(ARGV[5]))
return t

-- Read-only. The turns a read leaves unsummarized, once its caller has
-- selected (see describe in common.lua). ARGV: 1 packed '>dddc1B': below,
-- skip (0: none), now, encoding letter, English (1: lang=en).
-- Returns false | {covered, newest seq, turns, tokens or false}.
local below, skip, now, enc, english = struct.unpack('>dddc1B', ARGV[1])
local covered = tonumber(redis.call('HGET', KEYS[1], 'st') or '0')
return describe(covered, below, skip, enc, english == 1, nil, now)

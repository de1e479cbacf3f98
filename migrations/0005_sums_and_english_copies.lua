-- Layout 4 -> 5: turns may now carry English copies (new members and
-- records only: nothing to rewrite), and each session keeps the sums of
-- its finalized turns' costs in its meta hash (`ts`, see common.lua's
-- SUMS), which histories read to describe what a summary does not cover.
-- This computes them, a page of members a call.
-- KEYS: the session's keys in layout 4 (h r s), then in layout 5 (the
-- same names). ARGV: 1 the seq to go on after ('0': from the start).
-- Returns {'more', last seq} | {'done', 1 if sums were written, else 0}.
local PAGE = 1024
local LIVE = '1000000000000'
local after = ARGV[1]
local h = KEYS[4]
if after == '0' then redis.call('HDEL', h, 'ts~') end
local letter, sum, sum_en = '0', 0, 0
local partial = redis.call('HGET', h, 'ts~')
if partial then letter, sum, sum_en = struct.unpack('>c1dd', partial) end
local page = redis.call('ZRANGEBYSCORE', KEYS[6], '(' .. after, '(' .. LIVE,
  'WITHSCORES', 'LIMIT', 0, PAGE)
for i = 1, #page, 2 do
  local qe, ae, _, u, _, s = struct.unpack('>c1c1I4I4I4I4', page[i], 17)
  local l = '-'
  if qe == ae and string.find('ohcPER', qe, 1, true) then l = qe end
  if letter == '0' then letter = l elseif letter ~= l then letter = '-' end
  sum, sum_en = sum + u + s, sum_en + u + s
end
if #page == 2 * PAGE then
  redis.call('HSET', h, 'ts~', struct.pack('>c1dd', letter, sum, sum_en))
  return {'more', page[#page]}
end
redis.call('HDEL', h, 'ts~')
if letter == '0' then return {'done', 0} end
redis.call('HSET', h, 'ts', struct.pack('>c1dd', letter, sum, sum_en))
return {'done', 1}

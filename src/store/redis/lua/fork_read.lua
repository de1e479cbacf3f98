-- A fork's read of its source, a page at a time: the finalized turns with
-- after < seq <= through, records whole, at most about `max` bytes of
-- them (one turn at least). ARGV: 1 numbers packed '>ddd': through (0:
-- the newest finalized turn), after, max bytes; 2 user_id or ''; 3 the
-- generation the fork read first, or '' (a first page: also the owner
-- check, the bounds and the summary).
-- Returns {'not_found'} | {'owner_mismatch'} | {'replaced'} |
--   {'beyond', newest} | {'empty', oldest seq or 0} |
--   {'ok', owner or '', generation, through, summary ({text, header, st}
--    when it covers no turn past through) or false, 1 when more turns
--    follow this page else 0, then five values a turn: seq, member,
--    head, tail or '', English copies or ''}
local through, after, max = struct.unpack('>ddd', ARGV[1])
local user, expected = ARGV[2], ARGV[3]
local meta = redis.call('HMGET', KEYS[1], 'user_id', 'g', 'created_at', 'st', 'sm', 'sh')
if not meta[3] then return {'not_found'} end
local gen = generation(meta[2], meta[3])
local owner = meta[1]
if owner == '' then owner = false end
if expected ~= '' and gen ~= expected then return {'replaced'} end

local summary = false
if expected == '' then
  if access(owner, user) == 'mismatch' then return {'owner_mismatch'} end
  local newest = redis.call('ZREVRANGEBYSCORE', KEYS[3], '(' .. LIVE, '-inf', 'WITHSCORES', 'LIMIT', 0, 1)
  local top = tonumber(newest[2] or '0')
  if through == 0 then through = top end
  if through > top then return {'beyond', top} end
  local oldest = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', '(' .. LIVE, 'WITHSCORES', 'LIMIT', 0, 1)
  if not oldest[2] or tonumber(oldest[2]) > through then
    return {'empty', tonumber(oldest[2] or '0')}
  end
  if meta[4] and meta[5] and tonumber(meta[4]) <= through then
    summary = {meta[5], meta[6] or '', meta[4]}
  end
end

local PAGE = 256
local page = redis.call('ZRANGEBYSCORE', KEYS[3], '(' .. string.format('%d', after),
  string.format('%d', through), 'WITHSCORES', 'LIMIT', 0, PAGE)
local out = {'ok', owner or '', gen, through, summary, 0}
local bytes, taken = 0, 0
for i = 1, #page, 2 do
  if taken > 0 and bytes >= max then
    out[6] = 1
    break
  end
  local id = string.sub(page[i], 1, ID)
  local rec = redis.call('HMGET', KEYS[2], id, id .. 't', id .. 'e')
  if rec[1] then
    out[#out + 1] = page[i + 1]
    out[#out + 1] = page[i]
    out[#out + 1] = rec[1]
    out[#out + 1] = rec[2] or ''
    out[#out + 1] = rec[3] or ''
    bytes = bytes + #rec[1] + #(rec[2] or '') + #(rec[3] or '')
  end
  taken = taken + 1
end
if out[6] == 0 and #page == 2 * PAGE and tonumber(page[#page]) < through then out[6] = 1 end
return out

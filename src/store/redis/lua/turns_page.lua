-- Read-only. A page of finalized turns, oldest first, for an export.
-- ARGV: 1 packed '>ddd': after seq, at most this many turns, at most this
-- many bytes of texts (but one turn at least).
-- Returns flat {turn id, whole record, English copies or false} triples.
local after, max_turns, max_bytes = struct.unpack('>ddd', ARGV[1])
local members = redis.call('ZRANGEBYSCORE', KEYS[3], '(' .. after, '(' .. LIVE,
  'LIMIT', 0, max_turns)
local out, bytes = {}, 0
for _, m in ipairs(members) do
  local qb, ab = struct.unpack('>I4I4', m, ID + 23)
  local size = qb + ab
  if #m > BASE then
    local flags, _, _, _, _, _, eqb, eab = struct.unpack(EN_COSTS, m, BASE + 1)
    if flags % 2 == 1 then size = size + eqb end
    if flags >= 2 then size = size + eab end
  end
  if #out > 0 and bytes + size > max_bytes then break end
  bytes = bytes + size
  local id = string.sub(m, 1, ID)
  local got = redis.call('HMGET', KEYS[2], id, id .. 't', id .. 'e')
  if not got[1] then return redis.error_reply('turnstore: a turn has no record') end
  out[#out + 1] = id
  out[#out + 1] = assemble(got[1], got[2], qb, ab, qb, ab)
  out[#out + 1] = got[3] or false
end
return out

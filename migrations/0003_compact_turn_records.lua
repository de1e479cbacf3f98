-- Migration 0003: layout 2 -> 3. Turn records leave out what Redis already
-- holds or what is nearly always the same, about 70 bytes of every turn:
--   - the turn id ("id":"<uuid>"): it is the hash field the record is
--     stored under;
--   - the encoding of the token counts when it is o200k_base
--     ("e":"o200k_base"), now the value an absent "e" stands for.
--
-- Run once per session. KEYS[1..6]: the session's keys in layout 2,
-- KEYS[7..12]: the same keys in layout 3 (unchanged). Records are rewritten
-- as text: in JSON a quote inside a string is always escaped, so the
-- unescaped `"id":"` and `"n":{"e":"o200k_base",` below can only be the
-- record's own keys, never text a user wrote. HSET keeps each key's TTL.
-- Idempotent: a record already compact matches nothing and is left alone.
-- Returns {records rewritten, 0}.
local function compact(rec)
  local out = string.gsub(rec, '^{"p":{"s":(%d+),"id":"[%x%-]+",', '{"p":{"s":%1,', 1)
  out = string.gsub(out, '^{"s":(%d+),"id":"[%x%-]+",', '{"s":%1,', 1)
  out = string.gsub(out, '"n":{"e":"o200k_base",', '"n":{')
  return out
end

local rewritten = 0
for _, key in ipairs({KEYS[2], KEYS[4]}) do
  local all = redis.call('HGETALL', key)
  for i = 1, #all, 2 do
    local new = compact(all[i + 1])
    if new ~= all[i + 1] then
      redis.call('HSET', key, all[i], new)
      rewritten = rewritten + 1
    end
  end
end
return {rewritten, 0}

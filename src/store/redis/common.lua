-- Shared by every session script. KEYS, all under one {session_id} hash tag
-- (suffixes m, t, o, p, d, i in layout 2):
--   1 meta       hash: user_id, created_at, last_active_at, next_seq, indexed_at
--   2 turns      hash: turn_id -> finalized turn JSON {"p":{...},"f":{...}}
--                (layout 3: records leave out the turn id, their hash field)
--   3 order      zset: turn_id scored by seq (finalized turns)
--   4 pending    hash: turn_id -> pending turn JSON {"s":seq,...}
--   5 deadlines  zset: turn_id scored by the ms its pending turn expires
--   6 idem       hash: idempotency key -> "turn_id seq request_hash"
-- Times are milliseconds since the epoch, given by the caller.

-- The idempotency key a pending or finalized record holds, or nil. Read
-- from the text, not decoded: keys are identifiers (no quote, no
-- backslash), and in JSON an unescaped `"k":"` can only be the record's
-- own key, never text inside a string.
local function idem_key_of(json)
  return string.match(json, '"k":"([^"]+)"')
end

-- Frees an idempotency key, if it still names this turn.
local function drop_key(key, turn_id)
  if not key then return end
  local e = redis.call('HGET', KEYS[6], key)
  if e and string.sub(e, 1, #turn_id + 1) == turn_id .. ' ' then
    redis.call('HDEL', KEYS[6], key)
  end
end

local function purge_pending(now)
  local ids = redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', now)
  for _, id in ipairs(ids) do
    local rec = redis.call('HGET', KEYS[4], id)
    if rec then
      drop_key(idem_key_of(rec), id)
      redis.call('HDEL', KEYS[4], id)
    end
  end
  if #ids > 0 then redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', now) end
  return #ids
end

local function live_pending(now)
  return redis.call('ZCOUNT', KEYS[5], '(' .. now, '+inf')
end

local function touch(ttl)
  for i = 1, 6 do redis.call('PEXPIRE', KEYS[i], ttl) end
end

-- HMGET in slices: unpack() of thousands of ids would overflow Lua's stack.
local function hmget_all(key, ids)
  local out = {}
  for i = 1, #ids, 512 do
    local slice = {}
    for j = i, math.min(i + 511, #ids) do slice[#slice + 1] = ids[j] end
    local got = redis.call('HMGET', key, unpack(slice))
    for j = 1, #slice do out[#out + 1] = got[j] end
  end
  return out
end

-- The seq at the head of a pending record: {"s":<seq>,...}.
local function seq_of(rec)
  return tonumber(string.match(rec, '^{"s":(%d+)'))
end

-- Finalized turns with seq < before:
-- {total, ids newest first (at most limit), their records, first id or false, its record or false}.
local function read_history(before, limit, keep_first)
  local upper = '(' .. before
  local total = redis.call('ZCOUNT', KEYS[3], '-inf', upper)
  local ids, recs = {}, {}
  local first_id, first = false, false
  if limit > 0 and total > 0 then
    ids = redis.call('ZREVRANGEBYSCORE', KEYS[3], upper, '-inf', 'LIMIT', 0, limit)
    recs = hmget_all(KEYS[2], ids)
    if keep_first then
      local f = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', upper, 'LIMIT', 0, 1)
      if #f > 0 then first_id, first = f[1], redis.call('HGET', KEYS[2], f[1]) end
    end
  end
  return {total, ids, recs, first_id, first}
end

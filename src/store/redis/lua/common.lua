-- Shared by every session script (layout 4). KEYS, all under one
-- {session_id} hash tag:
--   1 m  meta hash: user_id, created_at, last_active_at, next_seq, ix (the
--        time the owner's index entry reaches until, see index_add.lua)
--   2 t  finalized turns hash: turn id -> record
--   3 o  order zset: seq -> turn id .. costs (COSTS below)
--   4 p  pending turns hash: turn id -> record
--   5 d  deadlines zset: turn id scored by the ms its pending turn expires
--   6 i  idempotency hash: key -> turn id .. ' ' .. seq .. ' ' .. request hash
--   7 f  fences hash: user -> index time (see probe.lua; not a session key)
-- Turn ids are the 16 bytes of the UUID. Records are one header line, then
-- the texts as they are (no escaping, so a read can cut them):
--   pending   "<seq> <started_at> <key> <enc> <q> <u>\n<query>"
--   finalized "<seq> <started_at> <finalized_at> <key> <query bytes>\n<query><answer>"
-- key is the idempotency key or '-' (keys never start with '-'), enc the
-- letter of the encoding the counts are in, q and u the question's counts.
-- Times are milliseconds since the epoch, given by the caller.

-- After the turn id in an `o` member: the encodings of the question's and
-- of the answer's counts, then q, u ("User: q\n"), a, s ("Assistant:
-- a\n\n"), l ("Assistant: a"), the question's and the answer's bytes. A
-- read budgets from these without loading the turns it does not return.
local COSTS = '>c1c1I4I4I4I4I4I4I4'
local ID = 16
-- Expired pending turns purged per call, turns trimmed per finalize: a
-- backlog is worked off by the next calls, none of them long.
local PURGE = 128
local TRIM = 128

local function key_of(rec, field)
  local k = string.match(rec, field == 3 and '^%d+ %d+ (%S+)' or '^%d+ %d+ %d+ (%S+)')
  if k ~= '-' then return k end
end

-- Frees an idempotency key, if it still names this turn.
local function drop_key(key, turn_id)
  if not key then return end
  local e = redis.call('HGET', KEYS[6], key)
  if e and string.sub(e, 1, ID) == turn_id then redis.call('HDEL', KEYS[6], key) end
end

local function purge_pending(now)
  local ids = redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', now, 'LIMIT', 0, PURGE)
  if #ids == 0 then return 0 end
  local keyed = redis.call('HLEN', KEYS[6]) > 0
  for _, id in ipairs(ids) do
    if keyed then
      local rec = redis.call('HGET', KEYS[4], id)
      if rec then drop_key(key_of(rec, 3), id) end
    end
    redis.call('HDEL', KEYS[4], id)
  end
  redis.call('ZREM', KEYS[5], unpack(ids))
  return #ids
end

local function live_pending(now)
  return redis.call('ZCOUNT', KEYS[5], '(' .. now, '+inf')
end

local function touch(ttl)
  for i = 1, 6 do redis.call('PEXPIRE', KEYS[i], ttl) end
end

-- Marks that the index entry (user, time) may be removed: a claim of this
-- session by that user must then bring an entry written later (start_turn.lua).
local function fence(user, time, ttl)
  local old = tonumber(redis.call('HGET', KEYS[7], user) or '0')
  if tonumber(time) > old then redis.call('HSET', KEYS[7], user, time) end
  redis.call('PEXPIRE', KEYS[7], ttl)
end

-- The history walk. It reads finalized turns newest first, from `before`
-- down to `after` (both excluded), and keeps the budget exactly as the
-- Rust `Selector` does while the stored counts apply (same encoding, no
-- truncation): so a read loads only the turns it returns. A turn whose
-- counts do not apply is handed over with the rest of the page, for the
-- caller to count. Each call stops at a page's size; the caller continues
-- with its budget state. Arguments, from ARGV[at]:
--   after, before ('inf' or a seq), room, max_tokens, max_bytes, encoding
--   letter, max query chars, max answer chars (0: no truncation), text
--   ('1' text/turns, '0' messages), header tokens, keep_first ('1'/'0'),
--   then the budget state: inner sum, newest inner (-1: none), newest
--   last, newest may change ('1'/'0'), bytes.
-- Returns {status 'done'|'more'|'stop', stop reason or '', next before
-- (for 'more'), candidates in range, first or false, flat entries}, each
-- entry (first too) being member, record (texts cut to what a truncating
-- read needs), bytes of the question in that record.
local WALK, PAGE_BYTES = 1024, 1048576   -- while counting here
local HANDOVER, HANDOVER_BYTES = 64, 262144  -- turns for the caller to count
local BATCH = 64

local function walk_args(at, before)
  local a = {
    after = tonumber(ARGV[at]), room = tonumber(ARGV[at + 2]),
    max_tokens = tonumber(ARGV[at + 3]), max_bytes = tonumber(ARGV[at + 4]),
    enc = ARGV[at + 5], max_q = tonumber(ARGV[at + 6]), max_a = tonumber(ARGV[at + 7]),
    text = ARGV[at + 8] == '1', header = tonumber(ARGV[at + 9]),
    keep_first = ARGV[at + 10] == '1',
    inner = tonumber(ARGV[at + 11]), ni = tonumber(ARGV[at + 12]),
    nl = tonumber(ARGV[at + 13]), change = ARGV[at + 14] == '1',
    bytes = tonumber(ARGV[at + 15]),
  }
  a.before = ARGV[at + 1] ~= 'inf' and tonumber(ARGV[at + 1]) or nil
  if before and (not a.before or before < a.before) then a.before = before end
  return a
end

local function walk(a)
  local lower = '(' .. a.after
  local upper = a.before and ('(' .. a.before) or '+inf'
  local total = redis.call('ZCOUNT', KEYS[3], lower, upper)
  local exact = true
  local cut_q = a.max_q > 0 and 4 * (a.max_q + 1) or nil
  local cut_a = a.max_a > 0 and 4 * (a.max_a + 1) or nil

  -- Stored costs as this read counts them, or nil when they do not apply.
  local function cost(m)
    local qe, ae, q, u, an, s, l, qb, ab = struct.unpack(COSTS, m, ID + 1)
    if qe ~= a.enc or ae ~= a.enc then return nil end
    if (cut_q and qb > a.max_q) or (cut_a and ab > a.max_a) then return nil end
    if a.text then return u + s, u + l, qb + ab end
    return q + an + 8, q + an + 8, qb + ab
  end
  -- 'ok' (taken), a stop reason, or nil (the caller must count it).
  local function offer(m)
    if a.room <= 0 then return 'limit' end
    local inner, last, bytes = cost(m)
    if not inner then return nil end
    local total_tokens = a.header + a.inner
    if a.change then
      total_tokens = total_tokens + math.max(a.ni, 0) + last
    else
      total_tokens = total_tokens + inner + a.nl
    end
    if total_tokens > a.max_tokens then return 'max_tokens' end
    if a.bytes + bytes > a.max_bytes then return 'max_bytes' end
    if a.change then
      if a.ni >= 0 then a.inner = a.inner + a.ni end
      a.ni, a.nl, a.change = inner, last, false
    else
      a.inner = a.inner + inner
    end
    a.bytes = a.bytes + bytes
    a.room = a.room - 1
    return 'ok'
  end
  -- Takes or hands over m; false when the walk stops before it.
  local stop = nil
  local function step(m)
    local r = exact and offer(m) or nil
    if r == nil then
      exact = false
      if a.room <= 0 then stop = {'stop', 'limit'} return false end
      a.room = a.room - 1
    elseif r ~= 'ok' then
      stop = {'stop', r}
      return false
    end
    return true
  end
  local function size(m)
    local _, _, _, _, _, _, _, qb, ab = struct.unpack(COSTS, m, ID + 1)
    if cut_q then qb = math.min(qb, cut_q) end
    if cut_a then ab = math.min(ab, cut_a) end
    return qb + ab
  end

  local first = false
  if a.keep_first and total > 0 then
    local f = redis.call('ZRANGEBYSCORE', KEYS[3], lower, upper, 'WITHSCORES', 'LIMIT', 0, 1)
    if not step(f[1]) then return {stop[1], stop[2], 0, total, false, {}} end
    if exact then a.change = true end
    first = f[1]
    lower = '(' .. f[2]
  end

  local taken, walked, page_bytes, last_seq = {}, 0, 0, nil
  local status, reason, next_before = 'done', '', 0
  local cursor = upper
  while not stop do
    local want = BATCH
    if exact then want = math.min(BATCH, a.room + 1) end
    local batch = redis.call('ZREVRANGEBYSCORE', KEYS[3], cursor, lower, 'WITHSCORES', 'LIMIT', 0, math.max(want, 1))
    if #batch == 0 then break end
    for i = 1, #batch, 2 do
      local m = batch[i]
      if #taken > 0 and (walked >= (exact and WALK or HANDOVER)
          or page_bytes >= (exact and PAGE_BYTES or HANDOVER_BYTES)) then
        stop = {'more', ''}
        next_before = last_seq
        break
      end
      if not step(m) then break end
      taken[#taken + 1] = m
      walked = walked + 1
      page_bytes = page_bytes + size(m)
      last_seq = batch[i + 1]
    end
    cursor = '(' .. (last_seq or batch[#batch])
    if not stop and #batch < 2 * want then break end
  end
  if stop then status, reason = stop[1], stop[2] end

  -- The records of what is returned, cut to what a truncating read needs.
  local ids = {}
  if first then ids[1] = string.sub(first, 1, ID) end
  for _, m in ipairs(taken) do ids[#ids + 1] = string.sub(m, 1, ID) end
  local recs = #ids > 0 and redis.call('HMGET', KEYS[2], unpack(ids)) or {}
  local function entry(m, rec, out)
    if not rec then return false end
    local _, _, _, _, _, _, _, qb, ab = struct.unpack(COSTS, m, ID + 1)
    if cut_q or cut_a then
      local h = string.find(rec, '\n', 1, true)
      local q = string.sub(rec, h + 1, h + math.min(qb, cut_q or qb))
      local an = string.sub(rec, h + qb + 1, h + qb + math.min(ab, cut_a or ab))
      rec = string.sub(rec, 1, h) .. q .. an
      qb = #q
    end
    out[#out + 1] = m
    out[#out + 1] = rec
    out[#out + 1] = qb
    return true
  end
  local entries, first_entry = {}, false
  local k = 1
  if first then
    first_entry = {}
    if not entry(first, recs[1], first_entry) then return redis.error_reply('turnstore: a turn has no record') end
    k = 2
  end
  for j, m in ipairs(taken) do
    if not entry(m, recs[k + j - 1], entries) then return redis.error_reply('turnstore: a turn has no record') end
  end
  return {status, reason, next_before, total, first_entry, entries}
end

-- Shared by every session script (layout 4). KEYS, all under one
-- {session_id} hash tag, so one slot; three of them, as every write
-- slides the TTL of each:
--   1 h  meta hash: user_id, created_at, last_active_at, next_seq, n (the
--        finalized turns), ix (the time the owner's index entry reaches
--        until, see index_add.lua), keyed ('1' once an idempotency key was
--        used), and one field per
--        idempotency key: 'k:' .. key -> turn id .. seq .. ' ' .. request hash
--   2 r  records hash: turn id -> pending record, or a finalized record's
--        head; turn id .. 't' -> its tail, if it has one (see HEAD)
--   3 s  turns zset, in two ranges of scores: finalized turns scored by
--        their seq (below LIVE), members turn id .. costs (COSTS below);
--        pending turns scored by the ms they expire (above LIVE: every
--        deadline is past 2001), members their turn id alone
--   4 f  fences zset: user scored by an index time (see fence; not a
--        session key)
-- Turn ids are the 16 bytes of the UUID. Records are one header line, then
-- the texts as they are (no escaping, so a read can cut them):
--   pending   "?<seq> <started_at> <key> <enc> <q> <u>\n<query>"
--   finalized "<seq> <started_at> <finalized_at> <key> <query bytes>\n<query><answer>"
-- key is the idempotency key or '-' (keys never start with '-'), enc the
-- letter of the encoding the counts are in (o h c P E R; counts under the
-- retired p e r may be short, and a reader takes them again), q and u the
-- question's counts.
-- A finalized record is kept as its head (the header and at most HEAD bytes
-- of each text) and, when a text is longer, its tail (the rest of the
-- question, then the rest of the answer), so that a read truncating to at
-- most HEAD / 4 - 1 characters loads heads only, whatever the turns hold.
-- Times are milliseconds since the epoch, given by the caller.

-- After the turn id in a finalized turn's member: the encodings of the
-- question's and of the answer's counts, then q, u ("User: q\n"), a, s
-- ("Assistant: a\n\n"), l ("Assistant: a"), the question's and the
-- answer's bytes. A read budgets from these without loading the turns it
-- does not return.
local COSTS = '>c1c1I4I4I4I4I4I4I4'
local ID = 16
local LIVE = '1000000000000'
-- Expired pending turns purged per start, turns trimmed per finalize: a
-- backlog is worked off by the next calls, none of them long.
local PURGE = 128
local TRIM = 128
local HEAD = 4096

local function is_pending(rec)
  return string.byte(rec, 1) == 63 -- '?'
end

-- The idempotency key a record names, or nil.
local function key_of(rec)
  local k = string.match(rec, is_pending(rec) and '^%?%d+ %d+ (%S+)' or '^%d+ %d+ %d+ (%S+)')
  if k ~= '-' then return k end
end

-- Frees an idempotency key, if it still names this turn.
local function drop_key(key, turn_id)
  if not key then return end
  local e = redis.call('HGET', KEYS[1], 'k:' .. key)
  if e and string.sub(e, 1, ID) == turn_id then redis.call('HDEL', KEYS[1], 'k:' .. key) end
end

-- Removes turns' records (heads and tails); frees their keys if the
-- session ever had keys.
local function forget(ids, keyed)
  local fields = {}
  for _, id in ipairs(ids) do
    if keyed then
      local rec = redis.call('HGET', KEYS[2], id)
      if rec then drop_key(key_of(rec), id) end
    end
    fields[#fields + 1] = id
    fields[#fields + 1] = id .. 't'
  end
  redis.call('HDEL', KEYS[2], unpack(fields))
end

-- A finalized record's head and tail (nil when both texts fit the head).
local function split(header, query, answer)
  local head = header .. '\n' .. string.sub(query, 1, HEAD) .. string.sub(answer, 1, HEAD)
  if #query <= HEAD and #answer <= HEAD then return head, nil end
  return head, string.sub(query, HEAD + 1) .. string.sub(answer, HEAD + 1)
end

-- A finalized record holding the first `q` bytes of its question and `a`
-- of its answer (whole: `qb` and `ab`), from its head and tail; the last
-- header field says how much of the question it holds.
local function assemble(head, tail, qb, ab, q, a)
  if not tail and q == qb and a == ab then return head end
  local prefix, nl = string.match(head, '^(%d+ %d+ %d+ %S+ )%d+\n()')
  local qh = math.min(qb, HEAD)
  local query = string.sub(head, nl, nl + math.min(q, qh) - 1)
  local answer = string.sub(head, nl + qh, nl + qh + math.min(a, HEAD) - 1)
  if q > HEAD then query = query .. string.sub(tail, 1, q - HEAD) end
  if a > HEAD then
    local qt = math.max(qb - HEAD, 0)
    answer = answer .. string.sub(tail, qt + 1, qt + a - HEAD)
  end
  return prefix .. q .. '\n' .. query .. answer
end

local function live_pending(now)
  return redis.call('ZCOUNT', KEYS[3], '(' .. now, '+inf')
end

local function touch(ttl)
  for i = 1, 3 do redis.call('PEXPIRE', KEYS[i], ttl) end
end

-- Marks that the index entry (user, time) may be removed: a claim of this
-- session by that user must then bring an entry written later
-- (start_turn.lua). `key`: the session's fences.
local function fence(key, user, time, ttl)
  redis.call('ZADD', key, 'GT', time, user)
  redis.call('PEXPIRE', key, ttl)
end

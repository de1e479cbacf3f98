-- Shared by every session script (layout 5). KEYS, all under one
-- {session_id} hash tag, so one slot; three of them, as every write
-- slides the TTL of each:
--   1 h  meta hash: user_id, created_at, last_active_at, next_seq, n (the
--        finalized turns), ix (the time the owner's index entry reaches
--        until, see index_add.lua), keyed ('1' once an idempotency key was
--        used), ts and cs (sums of the finalized turns' costs, and of
--        those a summary covers: SUMS below), st (the seq a summary covers
--        up to; absent: none), sm (the summary), sh (its SUMMARY header),
--        g (the session's generation: the id of the turn that created
--        it, see generation), ia (when the owner's index entry last moved
--        to the top, see activity), and one field per
--        idempotency key: 'k:' .. key -> turn id .. seq .. ' ' .. request hash
--   2 r  records hash: turn id -> pending record, or a finalized record's
--        head; turn id .. 't' -> its tail, if it has one (see HEAD);
--        turn id .. 'e' -> its English copies, if it has any (ENGLISH);
--        turn id .. 'p' -> a pending turn's seq (a turn started before
--        these fields has none: its record is read)
--   3 s  turns zset, in two ranges of scores: finalized turns scored by
--        their seq (below LIVE), members turn id .. costs (COSTS below);
--        pending turns scored by the ms they expire (above LIVE: every
--        deadline is past 2001), members their turn id alone
--   4 f  fences zset: one member, '-', scored by an index time (see fence;
--        not a session key; a fence written before 2026-11-26 names a user
--        instead, and lives 2 minutes at most)
--   5 l  the summarizer's lock: its holder's token, with a TTL (not a
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
-- does not return. A turn with English copies has a second block
-- (EN_COSTS): which copies it has (1 the question's, 2 the answer's),
-- then the same seven numbers for the texts `lang=en` renders (each copy,
-- or the original where there is none).
local COSTS = '>c1c1I4I4I4I4I4I4I4'
local EN_COSTS = '>BI4I4I4I4I4I4I4'
local ID = 16
local BASE = ID + 30
-- English copies (field turn id .. 'e'): pending "<q> <u>\n<query copy>"
-- (its counts); finalized "<question copy bytes or -> <answer copy bytes
-- or ->\n<question copy><answer copy>".
-- SUMS: the encoding letter the sums are in ('0': no turn yet, '-':
-- turns of several encodings or a retired letter), then the sums of
-- u + s over the turns, as rendered and as `lang=en` renders them.
local SUMS = '>c1dd'
local CURRENT = 'ohcPER'
-- SUMMARY header: "<updated_at> <letter> <text> <alone> <joined> <message>
-- <bytes>": when it was written, the letter of its counts' encoding, the
-- counts (see SummaryTokens in tokens.rs) and its bytes.
local SUMMARY = '^(%d+) (%S) (%d+) (%d+) (%d+) (%d+) (%d+)$'
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

-- Removes turns' records (heads, tails, English copies); frees their keys
-- if the session ever had keys.
local function forget(ids, keyed)
  local fields = {}
  for _, id in ipairs(ids) do
    if keyed then
      local rec = redis.call('HGET', KEYS[2], id)
      if rec then drop_key(key_of(rec), id) end
    end
    fields[#fields + 1] = id
    fields[#fields + 1] = id .. 't'
    fields[#fields + 1] = id .. 'e'
    fields[#fields + 1] = id .. 'p'
  end
  redis.call('HDEL', KEYS[2], unpack(fields))
end

-- What a finalized turn's member adds to the sums: its letter (or '-'),
-- u + s, and u + s as `lang=en` renders it.
local function contribution(m)
  local qe, ae, _, u, _, s = struct.unpack('>c1c1I4I4I4I4', m, ID + 1)
  local inner, inner_en = u + s, u + s
  if #m > BASE then
    local _, _, un, _, sn = struct.unpack('>BI4I4I4I4', m, BASE + 1)
    inner_en = un + sn
  end
  local letter = '-'
  if qe == ae and string.find(CURRENT, qe, 1, true) then letter = qe end
  return letter, inner, inner_en
end

-- u + s of a finalized turn's member, as the read's language renders it.
local function text_inner(m, english)
  if english and #m > BASE then
    local _, _, un, _, sn = struct.unpack('>BI4I4I4I4', m, BASE + 1)
    return un + sn
  end
  local _, _, _, u, _, s = struct.unpack('>c1c1I4I4I4I4', m, ID + 1)
  return u + s
end

-- What the newest block counts more than an inner one: l - s.
local function last_adjust(m, english)
  if english and #m > BASE then
    local _, _, _, _, sn, ln = struct.unpack('>BI4I4I4I4I4', m, BASE + 1)
    return ln - sn
  end
  local _, _, _, _, _, s, l = struct.unpack('>c1c1I4I4I4I4I4', m, ID + 1)
  return l - s
end

local function unpack_sums(packed)
  if not packed then return '0', 0, 0 end
  local letter, sum, sum_en = struct.unpack(SUMS, packed)
  return letter, sum, sum_en
end

-- Adds (sign 1) or takes away (-1) finalized turns' members to the sums:
-- of every turn (ts), and of those a summary covers (cs: seq <= st).
-- `members`: flat member, seq pairs. `left`: finalized turns after the
-- change (0 empties the sums). `sums` (optional): {ts, cs, st} as the
-- caller read them from h, updated here (`sums.cs_changed` when cs is),
-- for the caller to write with its own HSET; without it, they are read
-- and written here.
local function tally(members, sign, left, sums)
  local m = sums or redis.call('HMGET', KEYS[1], 'ts', 'cs', 'st')
  local covered_to = tonumber(m[3] or '0')
  local tl, ts, tse = unpack_sums(m[1])
  local cl, cs, cse = unpack_sums(m[2])
  local covered = false
  for i = 1, #members, 2 do
    local letter, inner, inner_en = contribution(members[i])
    ts, tse = ts + sign * inner, tse + sign * inner_en
    if sign > 0 then
      if tl == '0' then tl = letter elseif tl ~= letter then tl = '-' end
    end
    if tonumber(members[i + 1]) <= covered_to then
      covered = true
      cs, cse = cs + sign * inner, cse + sign * inner_en
      if sign > 0 then
        if cl == '0' then cl = letter elseif cl ~= letter then cl = '-' end
      end
    end
  end
  if left == 0 then tl, ts, tse = '0', 0, 0 end
  m[1] = struct.pack(SUMS, tl, ts, tse)
  if covered then
    m[2] = struct.pack(SUMS, cl, cs, cse)
    m.cs_changed = true
  end
  if sums then return end
  if covered then
    redis.call('HSET', KEYS[1], 'ts', m[1], 'cs', m[2])
  else
    redis.call('HSET', KEYS[1], 'ts', m[1])
  end
end

-- A finalized turn's member with its English block (EN_COSTS) and its
-- English record, or the member as it is and false when it has no copy:
-- `query_en` the question's copy or false, eq and eu its counts (the
-- question's own without one); a, s, l the answer's counts, `answer_en`
-- its copy or '', ea, es, el that copy's.
local function with_english(member, query, answer, query_en, eq, eu, a, s, l, answer_en, ea, es, el)
  if not query_en and answer_en == '' then return member, false end
  local flags, qb_en, ab_en = 0, #query, #answer
  if query_en then flags, qb_en = 1, #query_en end
  if answer_en ~= '' then
    flags, a, s, l, ab_en = flags + 2, ea, es, el, #answer_en
  end
  return member .. struct.pack(EN_COSTS, flags, eq, eu, a, s, l, qb_en, ab_en),
    (query_en and #query_en or '-') .. ' ' .. ((answer_en ~= '') and #answer_en or '-') .. '\n' ..
    (query_en or '') .. answer_en
end

-- A finalized record's head and tail (nil when both texts fit the head).
local function split(header, query, answer)
  -- (string.sub makes, and hashes, a string even when it is the whole one.)
  if #query <= HEAD and #answer <= HEAD then return header .. '\n' .. query .. answer, nil end
  local head = header .. '\n' .. string.sub(query, 1, HEAD) .. string.sub(answer, 1, HEAD)
  return head, string.sub(query, HEAD + 1) .. string.sub(answer, HEAD + 1)
end

-- Writes a finalized turn's record: its head, its tail when the texts do
-- not fit the head, its English copies (ENGLISH) when it has some.
-- Returns whether it has a tail.
local function write_finalized(tid, header, query, answer, english)
  local head, tail = split(header, query, answer)
  local fields = {tid, head}
  if tail then
    fields[#fields + 1] = tid .. 't'
    fields[#fields + 1] = tail
  end
  if english then
    fields[#fields + 1] = tid .. 'e'
    fields[#fields + 1] = english
  end
  redis.call('HSET', KEYS[2], unpack(fields))
  return tail ~= nil
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

-- The seqs of the pending turns live at `now`, read from their short
-- '<id>p' fields (the records hold whole questions); a turn started before
-- those fields were written is read from its record.
local function pending_seqs(now)
  local ids = redis.call('ZRANGEBYSCORE', KEYS[3], '(' .. now, '+inf')
  if #ids == 0 then return {} end
  local marks = {}
  for i, id in ipairs(ids) do marks[i] = id .. 'p' end
  local seqs = {}
  for i, mark in ipairs(redis.call('HMGET', KEYS[2], unpack(marks))) do
    local seq = tonumber(mark)
    if not seq then
      local rec = redis.call('HGET', KEYS[2], ids[i])
      seq = rec and tonumber(string.match(rec, '^%?(%d+)'))
    end
    if seq then seqs[#seqs + 1] = seq end
  end
  return seqs
end

-- The seq of the oldest pending turn live at `now`, or nil. A summary may
-- not cover it (it may yet be finalized), so the unsummarized turns end
-- below it. Costs the live pending turns (at most the pending cap).
local function oldest_pending(now)
  local oldest = nil
  for _, seq in ipairs(pending_seqs(now)) do
    if not oldest or seq < oldest then oldest = seq end
  end
  return oldest
end

-- With more finalized turns than this after the oldest pending turn, a
-- read does not sum the tokens it leaves unsummarized (MAX_WAITING in
-- store/mod.rs).
local MAX_WAITING = 256

-- The text_inner sum over the finalized turns with lo <= seq < hi.
local function sum_inner(lo, hi, english)
  local sum = 0
  for _, x in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], lo, '(' .. hi)) do
    sum = sum + text_inner(x, english)
  end
  return sum
end

-- The session's generation, as a summary write names it: the id of the
-- turn that created the session (meta 'g'), unique to this incarnation of
-- its id; for a session created before 'g' was kept, 'c' .. created_at.
local function generation(g, created)
  return g or ('c' .. (created or ''))
end

local function touch(ttl)
  -- As a string: a number argument is formatted (%.17g) per call.
  ttl = string.format('%d', ttl)
  for i = 1, 3 do redis.call('PEXPIRE', KEYS[i], ttl) end
end

-- The finalized turns neither returned nor covered by the summary (seq in
-- (covered, below), but `skip`, the turn keep_first returned, and but the
-- turns from the oldest pending one on): {covered, the newest's seq, how
-- many, the tokens of their `text` blocks in the read's encoding (`enc`,
-- the letter) and language, or false when the session's turns are not all
-- counted in it or more than MAX_WAITING wait behind a pending turn};
-- false when there are none. `above`: the sum of text_inner over the
-- turns with seq >= below, when the caller knows it (else it is summed
-- here: what the read returned). `unpending`: the caller knows that no
-- turn below `below` is pending (none is, but a start's own). `near`
-- (optional), what a walk saw below `below`: {how many finalized turns
-- lie in (covered, below) or false, the newest finalized member below
-- `below` or false (not known), its seq}; `sums` (optional): meta 'ts'
-- and 'cs' as the caller read them. Each saves a call when it applies.
local function describe(covered, below, skip, enc, english, above, now, unpending, near, sums)
  -- Seqs are below LIVE: the rest of the zset is pending turns.
  below = math.min(below, tonumber(LIVE))
  -- A pending turn only lowers `below`: nothing to describe either way.
  if below <= covered + 1 then return false end
  local returned_from, waiting = below, 0
  local pending = nil
  if not unpending then pending = oldest_pending(now) end
  if pending and pending < below then
    below = pending
    waiting = redis.call('ZCOUNT', KEYS[3], below, '(' .. returned_from)
    near = nil
  end
  if below <= covered + 1 then return false end
  local lo, hi = '(' .. covered, '(' .. below
  -- `last`: the newest turn in range; false while not known, nil when
  -- there is none.
  local n, last, last_seq = false, false, nil
  if near then
    n = near[1]
    -- The newest below is in range when above what the summary covers;
    -- when it is `skip`, the one below it is wanted: read below.
    if near[2] and tonumber(near[3]) <= covered then
      last = nil
    elseif near[2] and tonumber(near[3]) ~= skip then
      last, last_seq = near[2], near[3]
    end
  end
  if not n then n = redis.call('ZCOUNT', KEYS[3], lo, hi) end
  if last == false then
    local top = redis.call('ZREVRANGEBYSCORE', KEYS[3], hi, lo, 'WITHSCORES', 'LIMIT', 0, 2)
    last, last_seq = top[1], top[2]
    if top[2] and tonumber(top[2]) == skip then last, last_seq = top[3], top[4] end
  end
  local skipped = false
  if skip > covered and skip < below then
    n = n - 1
    skipped = redis.call('ZRANGEBYSCORE', KEYS[3], skip, skip)[1]
  end
  if n <= 0 or not last then return false end
  local tokens = false
  local m = sums or redis.call('HMGET', KEYS[1], 'ts', 'cs')
  local tl, ts, tse = unpack_sums(m[1])
  if tl == enc and waiting <= MAX_WAITING then
    local _, cs, cse = unpack_sums(m[2])
    local all, cov = ts, cs
    if english then all, cov = tse, cse end
    if not above then above = sum_inner(returned_from, LIVE, english) end
    if waiting > 0 then above = above + sum_inner(below, returned_from, english) end
    local sum = all - cov - above
    if skipped then sum = sum - text_inner(skipped, english) end
    tokens = sum + last_adjust(last, english)
  end
  return {covered, tonumber(last_seq), n, tokens}
end

-- Adds the turns a summary now covers, (from, to], to the covered sums.
local function cover(from, to)
  local cl, cs, cse = unpack_sums(redis.call('HGET', KEYS[1], 'cs'))
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], '(' .. from, to)) do
    local letter, inner, inner_en = contribution(m)
    cs, cse = cs + inner, cse + inner_en
    if cl == '0' then cl = letter elseif cl ~= letter then cl = '-' end
  end
  redis.call('HSET', KEYS[1], 'cs', struct.pack(SUMS, cl, cs, cse))
end

-- Marks that an index entry of this session with this time may be
-- removed: a claim of the session must then bring an index entry written
-- later (start_turn.lua). One time for every user (the latest): a fence
-- names no user, so an erased user leaves no id behind. `key`: the
-- session's fences.
local function fence(key, time, ttl)
  redis.call('ZADD', key, 'GT', time, '-')
  redis.call('PEXPIRE', key, ttl)
end

-- The latest time the session was fenced at (0: never, or long ago).
local function fenced(key)
  return tonumber(redis.call('ZREVRANGE', key, 0, 0, 'WITHSCORES')[2] or '0')
end

-- Listings show a user's most recently active sessions first: each start
-- or import moves the owner's index entry to the top of their index (the
-- caller does, with index_add.lua's 'xx': another slot), at most once a
-- second. `written`: an entry was written for this very call (it is on
-- top already); `moved_at`: meta 'ia'. Returns 1 when the caller must move
-- it, else 0; records the time with `set` (field, value). The rule is
-- `moves_to_top` (rules.lua), as the memory store's `index_active` keeps it.
local function activity(owner, written, moved_at, now, set)
  if not owner then return 0 end
  if not written and not moves_to_top(false, tonumber(moved_at or '0'), now) then return 0 end
  set('ia', now)
  if written then return 0 end
  return 1
end

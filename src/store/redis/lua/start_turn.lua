-- ARGV: 1 numbers packed '>ddddddB': now, session ttl ms, pending ttl ms,
--         max pending turns, index needed ms (the owner's entry must reach
--         past now + this), time of the index entry the caller wrote (0:
--         none), 1 to read the history;
--       2 user_id or '', 3 turn id, 4 pending record without its seq
--       ("<started_at> <key> <enc> <q> <u>\n<query>"), 5 idempotency key or
--       '', 6 request hash, 7 user the caller wrote an index entry for, or
--       '', 8 the question's English copy as kept while pending
--       ("<q> <u>\n<copy>") or '', 9 the walk's arguments (see walk.lua)
--       when reading
-- Returns one of
--   {'owner_mismatch'} | {'idem_reused'} | {'too_many_pending', oldest deadline}
--   {'need_index', user, min time}: nothing written; write the user's index
--      entry (past min) and call again with it
--   {'ok'|'replay', owner, turn id, seq, started_at, history page or false,
--    pending turns before it, pending turns purged, the session's
--    generation, 1 when the caller must move the owner's index entry to
--    the top (see activity)}
local now, session_ttl, pending_ttl, cap, needed, written, reading =
  struct.unpack('>ddddddB', ARGV[1])
local user, tid_new, tail, key, hash, indexed_for, english =
  ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8]
reading = reading == 1

local meta = redis.call('HMGET', KEYS[1], 'user_id', 'ix', 'keyed', 'next_seq', 'k:' .. key, 'n',
  'g', 'created_at', 'ia', 'st', 'sh', 'ts', 'cs')
-- What the walk would read of h again.
local known = {meta[10], meta[11], sums = {meta[12], meta[13]}}
local owner = meta[1]
if owner == '' then owner = false end
local acc = access(owner, user)
if acc == 'mismatch' then return {'owner_mismatch'} end

-- The turn an earlier call made, again (`status`: 'replay' for a key's).
local function again(status, tid, seq, rec)
  -- Live pending turns are at most the cap (plus a purge's backlog).
  local before = 0
  for _, p in ipairs(pending_seqs(now)) do
    if p < seq then before = before + 1 end
  end
  local started = string.match(rec, '^%??%d+ (%d+)')
  local page = reading and walk(9, seq, nil, now, known) or false
  return {status, owner or '', tid, seq, started, page, before, 0, generation(meta[7], meta[8]), 0}
end

if key ~= '' and meta[5] then
  local entry = meta[5]
  local tid = string.sub(entry, 1, ID)
  local seq, stored_hash = string.match(string.sub(entry, ID + 1), '^(%d+) (%S+)$')
  if stored_hash ~= hash then return {'idem_reused'} end
  local rec = redis.call('HGET', KEYS[2], tid)
  if rec and is_pending(rec) then
    local deadline = redis.call('ZSCORE', KEYS[3], tid)
    if not (deadline and tonumber(deadline) > now) then rec = false end
  end
  if rec then return again('replay', tid, tonumber(seq), rec) end
end

-- Pending turns by deadline: the expired ones first (purged below, a
-- page at a time), then the live ones. One read in the usual case.
local window = PURGE + cap + 1
local deadlines = redis.call('ZRANGEBYSCORE', KEYS[3], LIVE, '+inf', 'WITHSCORES', 'LIMIT', 0, window)
local expired, pending, oldest, mine = {}, 0, nil, false
for i = 1, #deadlines, 2 do
  if tonumber(deadlines[i + 1]) <= now then
    if #expired < PURGE then expired[#expired + 1] = deadlines[i] end
  else
    pending = pending + 1
    oldest = oldest or deadlines[i + 1]
    if deadlines[i] == tid_new then mine = true end
  end
end
local more = #deadlines == 2 * window

-- This very call again: its connection dropped after it ran, and the
-- caller tried once more (a turn id is made per request). Its turn is
-- pending (live for the pending TTL, far longer than a retry takes), so
-- among those just read, unless there were more than a window's.
if mine or more then
  local rec = redis.call('HGET', KEYS[2], tid_new)
  if rec then return again('ok', tid_new, tonumber(string.match(rec, '^%??(%d+)')), rec) end
end

if more then pending = live_pending(now) end
if pending_full(pending, cap) then
  if not oldest then
    oldest = redis.call('ZRANGEBYSCORE', KEYS[3], '(' .. now, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)[2]
  end
  return {'too_many_pending', oldest}
end

-- The owner's index entry must exist before the session can be found
-- owned (a claim), and must outlive it (a refresh): see users.rs.
local claim = acc == 'claim'
local indexed = owner or (claim and user)
if indexed then
  if indexed_for == indexed then
    local since = fenced(KEYS[4])
    if since >= written then return {'need_index', indexed, since} end
  elseif index_due(claim, tonumber(meta[2] or '0'), now, needed) then
    return {'need_index', indexed, 0}
  end
end

if #expired > 0 then
  forget(expired, meta[3])
  redis.call('ZREM', KEYS[3], unpack(expired))
end
local seq = tonumber(meta[4] or '0') + 1
local fields = {'next_seq', seq, 'last_active_at', now}
local function set(f, v)
  fields[#fields + 1] = f
  fields[#fields + 1] = v
end
local gen = generation(meta[7], meta[8])
if seq == 1 then
  set('created_at', now)
  set('g', tid_new)
  gen = tid_new
end
if claim then
  owner = user
  set('user_id', user)
end
local fresh = indexed and indexed_for == indexed
if fresh then set('ix', written) end
local move = activity(owner, fresh, meta[9], now, set)
if key ~= '' then
  set('k:' .. key, tid_new .. seq .. ' ' .. hash)
  if not meta[3] then set('keyed', '1') end
end
redis.call('HSET', KEYS[1], unpack(fields))
-- '<id>p': the seq alone, so that finding the oldest pending turn does
-- not load questions.
if english ~= '' then
  redis.call('HSET', KEYS[2], tid_new, '?' .. seq .. ' ' .. tail, tid_new .. 'p', seq, tid_new .. 'e', english)
else
  redis.call('HSET', KEYS[2], tid_new, '?' .. seq .. ' ' .. tail, tid_new .. 'p', seq)
end
redis.call('ZADD', KEYS[3], now + pending_ttl, tid_new)
-- `pending`: the live pending turns but this one.
local page = reading and walk(9, seq, tonumber(meta[6] or '0'), now, known, pending == 0) or false
touch(session_ttl)
return {'ok', owner or '', tid_new, seq, string.match(tail, '^(%d+)'), page, pending, #expired, gen, move}

-- Appends finalized turns from a transcript, all at once. ARGV: 1 numbers
-- packed '>ddddd': now, session ttl ms, max_turns, index needed ms (the
-- owner's entry must reach past now + this), time of the index entry the
-- caller wrote (0: none); 2 user_id or '', 3 idempotency key or '', 4
-- request hash, 5 user the caller wrote an index entry for, or ''; then
-- four arguments a turn: its member without the seq (turn id .. COSTS),
-- '<started> <finalized>' (ms), its question, its answer.
-- Returns {'ok'|'replay', owner, first seq, last seq, 1 when the caller
--   must move the owner's index entry to the top (see activity), the ids
--   of trimmed turns whose records the caller frees (forget_turns.lua)} |
--   {'owner_mismatch'}
--   | {'idem_reused'} | {'need_index', user, min time}
-- An import's key names the seqs it made ('import:<first> <last> <hash>')
-- and lives as long as the session.
local now, ttl, max_turns, needed, written = struct.unpack('>ddddd', ARGV[1])
local user, key, hash, indexed_for = ARGV[2], ARGV[3], ARGV[4], ARGV[5]

local meta = redis.call('HMGET', KEYS[1], 'user_id', 'ix', 'keyed', 'next_seq', 'k:' .. key, 'n', 'ia')
local owner = meta[1]
if owner == '' then owner = false end
local acc = access(owner, user)
if acc == 'mismatch' then return {'owner_mismatch'} end
if key ~= '' and meta[5] then
  local first, last, stored = string.match(meta[5], '^import:(%d+) (%d+) (%S+)$')
  if stored ~= hash then return {'idem_reused'} end
  return {'replay', owner or '', tonumber(first), tonumber(last), 0, {}}
end

-- This very call again: its connection dropped after it ran, and the
-- caller tried once more (turn ids are made per request).
local mine = redis.call('HGET', KEYS[2], string.sub(ARGV[6], 1, ID))
if mine then
  local at = tonumber(string.match(mine, '^(%d+)'))
  return {'ok', owner or '', at, at + (#ARGV - 5) / 4 - 1, 0, {}}
end

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

local first = tonumber(meta[4] or '0') + 1
local seq = first - 1
local records, members, added = {}, {}, {}
for i = 6, #ARGV, 4 do
  seq = seq + 1
  local member, times, query, answer = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  local id = string.sub(member, 1, ID)
  local head, tail = split(seq .. ' ' .. times .. ' - ' .. #query, query, answer)
  records[#records + 1] = id
  records[#records + 1] = head
  if tail then
    records[#records + 1] = id .. 't'
    records[#records + 1] = tail
  end
  members[#members + 1] = seq
  members[#members + 1] = member
  added[#added + 1] = member
  added[#added + 1] = seq
end
-- unpack() takes a few thousand values at most: in batches.
local function batched(cmd, key, list)
  for i = 1, #list, 1000 do
    redis.call(cmd, key, unpack(list, i, math.min(i + 999, #list)))
  end
end
batched('HSET', KEYS[2], records)
batched('ZADD', KEYS[3], members)

local fields = {'next_seq', seq, 'last_active_at', now}
local function set(f, v)
  fields[#fields + 1] = f
  fields[#fields + 1] = v
end
if first == 1 then
  set('created_at', now)
  set('g', string.sub(ARGV[6], 1, ID))
end
if claim then
  owner = user
  set('user_id', user)
end
local fresh = indexed and indexed_for == indexed
if fresh then set('ix', written) end
local move = activity(owner, fresh, meta[7], now, set)
if key ~= '' then
  set('k:' .. key, 'import:' .. first .. ' ' .. seq .. ' ' .. hash)
  if not meta[3] then set('keyed', '1') end
end
local count = tonumber(meta[6] or '0') + (seq - first + 1)
set('n', count)
redis.call('HSET', KEYS[1], unpack(fields))
tally(added, 1, count)
-- The oldest go first; no more than this import brought. They leave the
-- turns at once (members are short); their records, up to 128 KiB and
-- more each, are freed TRIM at a time: the first here, the rest by the
-- caller (forget_turns.lua), so that no call frees a thousand of them.
local left = {}
local excess = excess_turns(count, max_turns)
if excess > 0 then
  local old = redis.call('ZPOPMIN', KEYS[3], excess)
  local ids = {}
  for i = 1, #old, 2 do
    local id = string.sub(old[i], 1, ID)
    if #ids < TRIM then ids[#ids + 1] = id else left[#left + 1] = id end
  end
  forget(ids, meta[3] or key ~= '')
  count = count - #old / 2
  tally(old, -1, count)
  redis.call('HSET', KEYS[1], 'n', count)
end
touch(ttl)
return {'ok', owner or '', first, seq, move, left}

-- ARGV: 1 now, 2 session ttl ms, 3 pending ttl ms, 4 user_id or '', 5 turn id,
--       6 pending record without its seq ("<started_at> <key> <enc> <q> <u>\n<query>"),
--       7 idempotency key or '', 8 request hash, 9 max pending turns,
--       10 index needed ms (the owner's entry must reach past now + this),
--       11 user the caller wrote an index entry for, or '', 12 its time,
--       13 '1' to read the history (walk arguments from 14; see common.lua)
-- Returns one of
--   {'owner_mismatch'} | {'idem_reused'} | {'too_many_pending', oldest deadline}
--   {'need_index', user, min time}: nothing written; write the user's index
--      entry (past min) and call again with it
--   {'ok'|'replay', owner, turn id, seq, started_at, history page or false,
--    pending turns before it, pending turns purged}
local now = tonumber(ARGV[1])
local user = ARGV[4]
local key = ARGV[7]
local reading = ARGV[13] == '1'

local owner = redis.call('HGET', KEYS[1], 'user_id')
if owner == '' then owner = false end
if owner and user ~= '' and owner ~= user then return {'owner_mismatch'} end

if key ~= '' then
  local entry = redis.call('HGET', KEYS[6], key)
  if entry then
    local tid = string.sub(entry, 1, ID)
    local seq, hash = string.match(string.sub(entry, ID + 2), '^(%d+) (%S+)$')
    if hash ~= ARGV[8] then return {'idem_reused'} end
    local rec = false
    local deadline = redis.call('ZSCORE', KEYS[5], tid)
    if deadline and tonumber(deadline) > now then rec = redis.call('HGET', KEYS[4], tid) end
    if not rec then rec = redis.call('HGET', KEYS[2], tid) end
    if rec then
      -- Live pending turns are at most the cap (plus a purge's backlog).
      seq = tonumber(seq)
      local before = 0
      for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[5], '(' .. now, '+inf')) do
        local p = redis.call('HGET', KEYS[4], id)
        if p and tonumber(string.match(p, '^(%d+)')) < seq then before = before + 1 end
      end
      local started = string.match(rec, '^%d+ (%d+)')
      local page = reading and walk(walk_args(14, seq)) or false
      return {'replay', owner or '', tid, seq, started, page, before, 0}
    end
  end
end

local pending = live_pending(now)
if pending >= tonumber(ARGV[9]) then
  local oldest = redis.call('ZRANGEBYSCORE', KEYS[5], '(' .. now, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
  return {'too_many_pending', oldest[2] or now}
end

-- The owner's index entry must exist before the session can be found
-- owned (a claim), and must outlive it (a refresh): see users.rs.
local claim = (not owner) and user ~= ''
local indexed = owner or (claim and user)
local written = tonumber(ARGV[12])
if indexed then
  if ARGV[11] == indexed then
    local fenced = tonumber(redis.call('HGET', KEYS[7], indexed) or '0')
    if fenced >= written then return {'need_index', indexed, fenced} end
  else
    local ix = tonumber(redis.call('HGET', KEYS[1], 'ix') or '0')
    if claim or ix < now + tonumber(ARGV[10]) then return {'need_index', indexed, 0} end
  end
end

local expired = purge_pending(now)
local seq = redis.call('HINCRBY', KEYS[1], 'next_seq', 1)
redis.call('HSETNX', KEYS[1], 'created_at', ARGV[1])
local meta = {'last_active_at', ARGV[1]}
if claim then
  owner = user
  meta[3], meta[4] = 'user_id', user
end
if indexed and ARGV[11] == indexed then
  meta[#meta + 1], meta[#meta + 2] = 'ix', ARGV[12]
end
redis.call('HSET', KEYS[1], unpack(meta))
redis.call('HSET', KEYS[4], ARGV[5], seq .. ' ' .. ARGV[6])
redis.call('ZADD', KEYS[5], now + tonumber(ARGV[3]), ARGV[5])
if key ~= '' then redis.call('HSET', KEYS[6], key, ARGV[5] .. ' ' .. seq .. ' ' .. ARGV[8]) end
local page = reading and walk(walk_args(14, seq)) or false
touch(ARGV[2])
return {'ok', owner or '', ARGV[5], seq, string.match(ARGV[6], '^(%d+)'), page, pending, expired}

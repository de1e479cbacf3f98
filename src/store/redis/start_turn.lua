-- ARGV: 1 now, 2 session ttl ms, 3 pending ttl ms, 4 user_id or '', 5 turn_id,
--       6 pending JSON without seq, 7 idempotency key or '', 8 request hash,
--       9 history limit (-1: no history), 10 keep_first '1'/'0', 11 index refresh ms
-- Returns {status, owner, kind, turn id, turn JSON, history or false, pending before, expired, reindex}
local now = tonumber(ARGV[1])
local user = ARGV[4]
local key = ARGV[7]
local limit = tonumber(ARGV[9])
local keep_first = ARGV[10] == '1'

local owner = redis.call('HGET', KEYS[1], 'user_id')
if owner == '' then owner = false end
if owner and user ~= '' and owner ~= user then return {'owner_mismatch'} end

local function history(before)
  if limit < 0 then return false end
  return read_history(before, limit, keep_first)
end

if key ~= '' then
  local entry = redis.call('HGET', KEYS[6], key)
  if entry then
    local tid, seq, hash = string.match(entry, '^(%S+) (%S+) (%S+)$')
    if hash ~= ARGV[8] then return {'idem_reused'} end
    local kind, rec = 'p', false
    local deadline = redis.call('ZSCORE', KEYS[5], tid)
    if deadline and tonumber(deadline) > now then rec = redis.call('HGET', KEYS[4], tid) end
    if not rec then kind, rec = 'f', redis.call('HGET', KEYS[2], tid) end
    if rec then
      local before = 0
      for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[5], '(' .. now, '+inf')) do
        local p = redis.call('HGET', KEYS[4], id)
        if p and seq_of(p) < tonumber(seq) then before = before + 1 end
      end
      return {'replay', owner or '', kind, tid, rec, history(seq), before, 0, 0}
    end
  end
end

local expired = purge_pending(now)
local created = redis.call('EXISTS', KEYS[1]) == 0
local claim = (not owner) and user ~= ''
local pending_before = live_pending(now)
local seq = redis.call('HINCRBY', KEYS[1], 'next_seq', 1)
if created then redis.call('HSET', KEYS[1], 'created_at', ARGV[1]) end
if claim then
  redis.call('HSET', KEYS[1], 'user_id', user)
  owner = user
end
redis.call('HSET', KEYS[1], 'last_active_at', ARGV[1])
local rec = '{"s":' .. seq .. ',' .. string.sub(ARGV[6], 2)
redis.call('HSET', KEYS[4], ARGV[5], rec)
redis.call('ZADD', KEYS[5], now + tonumber(ARGV[3]), ARGV[5])
if key ~= '' then redis.call('HSET', KEYS[6], key, ARGV[5] .. ' ' .. seq .. ' ' .. ARGV[8]) end
local reindex = 0
if owner then
  local last = tonumber(redis.call('HGET', KEYS[1], 'indexed_at') or '0')
  if claim or now - last >= tonumber(ARGV[11]) then
    reindex = 1
    redis.call('HSET', KEYS[1], 'indexed_at', ARGV[1])
  end
end
touch(ARGV[2])
return {'ok', owner or '', 'p', ARGV[5], rec, history(seq), pending_before, expired, reindex}

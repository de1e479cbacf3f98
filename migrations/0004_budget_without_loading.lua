-- Migration 0004: layout 3 -> 4. Reads budget without loading the turns
-- they do not return:
--   - each finalized turn's counts and sizes move into its member of the
--     order zset (16-byte turn id, then '>c1c1I4I4I4I4I4I4I4': encodings of
--     the question's and answer's counts, q, u, a, s, l, question bytes,
--     answer bytes), so a read walks them newest first and stops at its
--     budget;
--   - records become a header line and the raw texts (no JSON); a
--     finalized one keeps at most 4 KiB of each text in its head (under
--     the turn id) and the rest in its tail (under the id .. 't'), so a
--     truncating read loads heads only:
--       pending   "?<seq> <started_at> <key|-> <enc> <q> <u>\n<query>"
--       finalized "<seq> <started_at> <finalized_at> <key|-> <query bytes>\n<query><answer>"
--   - three keys a session instead of six (every write slides the TTL of
--     each): pending and finalized records share one hash (r); the
--     idempotency keys live in the meta hash (h, as 'k:<key>', with
--     keyed=1); finalized turns (scored by seq) and pending ones (scored
--     by deadline, all above 1e12) share one zset (s). New suffixes
--     (m t o p d i -> h r s), so a session still under its old meta key
--     is one not yet migrated; turn ids are their 16 bytes;
--   - meta counts the finalized turns (n), and its indexed_at (the last
--     index write) becomes ix (the time the
--     owner's index entry reaches until: indexed_at + the index horizon);
--     the runner rebuilds every user index from the sessions (P:u:<user>,
--     written before a session is finished) and drops the old ones
--     (P:user:<user>), so a session owned but missing from its user's list
--     in layout 3 is listed again.
--
-- KEYS[1..6]: the session's layout-3 keys (m t o p d i), KEYS[7..9]: its
-- layout-4 keys (h r s), one hash tag. ARGV: 1 now, 2 index horizon
-- ms, 3 '1' to finish (the runner has indexed the owner).
-- Runs in pages: each call converts about 512 KiB or 256 turns at most, so
-- no call is long whatever the session holds. Returns {status, records
-- rewritten, owner or '', ix}: 'more' (call again), 'ready' (all turns
-- moved: index the owner at ix, then call with ARGV[3] = '1'), 'done'.
-- Idempotent: what was moved is gone from the old keys.
local COSTS = '>c1c1I4I4I4I4I4I4I4'
local HEAD = 4096
local BUDGET, LIMIT = 524288, 256
local ENC = {o200k_base = 'o', o200k_harmony = 'h', cl100k_base = 'c', p50k_base = 'p',
             p50k_edit = 'e', r50k_base = 'r'}
local now, horizon = tonumber(ARGV[1]), tonumber(ARGV[2])

local function bin(id)
  return (string.gsub(string.gsub(id, '-', ''), '%x%x',
    function(h) return string.char(tonumber(h, 16)) end))
end
local function enc(n) return ENC[n.e or 'o200k_base'] or 'o' end
local function num(x) return string.format('%.0f', x) end

local ttl = redis.call('PTTL', KEYS[1])
local function expire()
  if ttl > 0 then
    for i = 7, 9 do redis.call('PEXPIRE', KEYS[i], ttl) end
  end
end

-- An idempotency entry "tid seq hash" that names this turn moves with it.
local function move_key(key, id)
  if not key then return end
  local e = redis.call('HGET', KEYS[6], key)
  if not e then return end
  local tid, rest = string.match(e, '^(%S+) (.*)$')
  if tid == id then
    redis.call('HSET', KEYS[7], 'k:' .. key, bin(id) .. rest, 'keyed', '1')
    redis.call('HDEL', KEYS[6], key)
  end
end

local spent, n, changes = 0, 0, 0
local function room() return spent < BUDGET and n < LIMIT end

-- Finalized turns, in seq order.
while room() do
  local ids = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
  if #ids == 0 then break end
  local id = ids[1]
  local json = redis.call('HGET', KEYS[2], id)
  if json then
    local r = cjson.decode(json)
    local p, f = r.p, r.f
    -- The head holds at most HEAD bytes of each text; the tail the rest.
    local head = num(p.s) .. ' ' .. num(p.t) .. ' ' .. num(f.t) .. ' ' .. (p.k or '-') .. ' '
      .. #p.q .. '\n' .. string.sub(p.q, 1, HEAD) .. string.sub(f.a, 1, HEAD)
    local member = bin(id) .. struct.pack(COSTS, enc(p.n), enc(f.n), p.n.q, p.n.u,
      f.n.a, f.n.s, f.n.l, #p.q, #f.a)
    redis.call('HSET', KEYS[8], bin(id), head)
    if #p.q > HEAD or #f.a > HEAD then
      redis.call('HSET', KEYS[8], bin(id) .. 't', string.sub(p.q, HEAD + 1) .. string.sub(f.a, HEAD + 1))
    end
    redis.call('ZADD', KEYS[9], ids[2], member)
    move_key(p.k, id)
    redis.call('HDEL', KEYS[2], id)
    spent, changes = spent + #json, changes + 1
  end
  redis.call('ZREM', KEYS[3], id)
  n = n + 1
end

-- Pending turns (expired ones too: the service purges them).
while room() do
  local ids = redis.call('ZRANGE', KEYS[5], 0, 0, 'WITHSCORES')
  if #ids == 0 then break end
  local id = ids[1]
  local json = redis.call('HGET', KEYS[4], id)
  if json then
    local r = cjson.decode(json)
    local rec = '?' .. num(r.s) .. ' ' .. num(r.t) .. ' ' .. (r.k or '-') .. ' ' .. enc(r.n) .. ' '
      .. num(r.n.q) .. ' ' .. num(r.n.u) .. '\n' .. r.q
    redis.call('HSET', KEYS[8], bin(id), rec)
    redis.call('ZADD', KEYS[9], ids[2], bin(id))
    move_key(r.k, id)
    redis.call('HDEL', KEYS[4], id)
    spent, changes = spent + #json, changes + 1
  end
  redis.call('ZREM', KEYS[5], id)
  n = n + 1
end
expire()
if not room() then return {'more', changes, '', 0} end

local meta = redis.call('HGETALL', KEYS[1])
local fields, owner, indexed_at = {}, '', nil
for i = 1, #meta, 2 do
  if meta[i] == 'indexed_at' then
    indexed_at = tonumber(meta[i + 1])
  else
    if meta[i] == 'user_id' then owner = meta[i + 1] end
    fields[#fields + 1] = meta[i]
    fields[#fields + 1] = meta[i + 1]
  end
end
local ix = (indexed_at or now) + horizon
if ARGV[3] ~= '1' then return {'ready', changes, owner, num(ix)} end

if owner ~= '' then
  fields[#fields + 1] = 'ix'
  fields[#fields + 1] = num(ix)
end
fields[#fields + 1] = 'n'
fields[#fields + 1] = redis.call('ZCOUNT', KEYS[9], '-inf', '(1000000000000')
redis.call('HSET', KEYS[7], unpack(fields))
-- Turns a layout-3 session held without an order entry (or keys naming
-- no turn) were never readable: they go with the old keys.
redis.call('UNLINK', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6])
expire()
return {'done', changes, owner, num(ix)}

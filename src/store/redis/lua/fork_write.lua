-- A page of a fork's copy, written to the new session's staging keys
-- (KEYS 6 records, 7 turns, 8 the attempt's marker: its token, when it
-- last wrote, what it read of the source first, the sums and count of
-- what it staged): nothing a reader or a start sees until
-- fork_publish.lua renames them into place.
-- ARGV: 1 numbers packed '>dddd': now, stage ttl ms, 1 on an attempt's
-- first call (no turns) else 0, the seq the copied summary covers to (0:
-- none); 2 the attempt's token (a retry of a request with an
-- idempotency key has the first try's); 3 idempotency key or ''; 4-8
-- what the first page said of the source: its generation, the fork's
-- through seq, the owner or '', the summary's text and header or ''
-- ('' on a first call); then five values a turn (fork_read.lua's): seq,
-- member, head, tail or '', English copies or ''.
-- A page written again (its reply lost) adds nothing: the seqs up to the
-- marker's top are staged already.
-- Returns {'ok'} | {'resume', top, generation, through, owner, summary
--   text, header, covered, turns staged} (a first call finding its token's
--   staging: the copy goes on after top) | {'exists', the key's record in the session
--   or '', its owner or ''} | {'busy', ms since the other attempt last
--   wrote} | {'lost'}
-- An attempt that wrote nothing for this long (ms) is taken to be dead.
local FORK_STALE = 5000
local now, stage_ttl, first, covered = struct.unpack('>dddd', ARGV[1])
local token, key = ARGV[2], ARGV[3]
local there = redis.call('HMGET', KEYS[1], 'created_at', 'k:' .. key, 'user_id')
if there[1] then return {'exists', key ~= '' and there[2] or '', there[3] or ''} end
local marker = redis.call('HMGET', KEYS[8], 'token', 'touched', 'top', 'gen', 'through', 'owner',
  'sm', 'sh', 'covered', 'n')
if first == 1 then
  if marker[1] == token and marker[4] then
    redis.call('HSET', KEYS[8], 'touched', now)
    return {'resume', tonumber(marker[3] or '0'), marker[4], tonumber(marker[5]), marker[6],
      marker[7], marker[8], tonumber(marker[9] or '0'), tonumber(marker[10] or '0')}
  end
  -- Another attempt's staging: it goes once it stopped writing.
  if marker[1] and marker[1] ~= token and now - tonumber(marker[2]) < FORK_STALE then
    return {'busy', now - tonumber(marker[2])}
  end
  redis.call('UNLINK', KEYS[6], KEYS[7], KEYS[8])
elseif marker[1] ~= token then
  return {'lost'}
end

local staged = redis.call('HMGET', KEYS[8], 'n', 'ts', 'cs', 'top')
local top = tonumber(staged[4] or '0')
local members, records = {}, {}
local scored = {}
for i = 9, #ARGV, 5 do
  local seq, member, id = ARGV[i], ARGV[i + 1], string.sub(ARGV[i + 1], 1, ID)
  if tonumber(seq) > top then
    members[#members + 1] = seq
    members[#members + 1] = member
    scored[#scored + 1] = member
    scored[#scored + 1] = seq
    records[#records + 1] = id
    records[#records + 1] = ARGV[i + 2]
    if ARGV[i + 3] ~= '' then
      records[#records + 1] = id .. 't'
      records[#records + 1] = ARGV[i + 3]
    end
    if ARGV[i + 4] ~= '' then
      records[#records + 1] = id .. 'e'
      records[#records + 1] = ARGV[i + 4]
    end
  end
end
local count = tonumber(staged[1] or '0') + #scored / 2
local sums = {staged[2], staged[3], string.format('%d', covered)}
if #scored > 0 then
  redis.call('ZADD', KEYS[7], unpack(members))
  redis.call('HSET', KEYS[6], unpack(records))
  tally(scored, 1, count, sums)
end
if #scored > 0 then top = tonumber(scored[#scored]) end
local fields = {'token', token, 'touched', now, 'n', count, 'top', top}
if first == 0 and not marker[4] then
  local source = {'gen', ARGV[4], 'through', ARGV[5], 'owner', ARGV[6], 'sm', ARGV[7],
    'sh', ARGV[8], 'covered', string.format('%d', covered)}
  for _, v in ipairs(source) do fields[#fields + 1] = v end
end
if sums[1] then
  fields[#fields + 1] = 'ts'
  fields[#fields + 1] = sums[1]
end
if sums[2] then
  fields[#fields + 1] = 'cs'
  fields[#fields + 1] = sums[2]
end
redis.call('HSET', KEYS[8], unpack(fields))
stage_ttl = string.format('%d', stage_ttl)
for i = 6, 8 do redis.call('PEXPIRE', KEYS[i], stage_ttl) end
return {'ok'}

-- The history walk. It reads finalized turns newest first, from `before`
-- down to `after` (both excluded), and keeps the budget exactly as the
-- Rust `Selector` does while the stored counts apply (same encoding, no
-- truncation): so a read loads only the turns it returns. (The twin of
-- history/select.rs' rule: walk_twin.rs compares the two directly.) A turn whose
-- counts do not apply is handed over with the rest of the page, for the
-- caller to count. Each call stops at a page's size; the caller continues
-- with its budget state. Its arguments are packed in ARGV[at] (WALK_ARGS;
-- one string, as every argument and every tonumber costs more than the
-- walk's own logic): after, before (-1: none), room, max_tokens, max_bytes,
-- max query chars, max answer chars (0: no truncation), header tokens,
-- then the budget state: inner sum, newest inner (-1: none), newest last,
-- bytes; then the encoding letter, and flags: text (1) or messages (0),
-- keep_first, newest may change, English (1: `lang=en`, the costs and
-- texts of turns' English copies where they have them), copies (1: hand
-- over translated turns' English copies beside their texts), summary (1:
-- begin with the session's summary, the candidates above what it covers),
-- describe (1: a first call, which describes the unsummarized turns when
-- it ends the walk), budget (0: the caller budgets every turn
-- itself, a template's read: hand them all over); then the stride of a
-- stable window (0: sliding; see history/window.rs), which the
-- description of a walk that ends here follows: the turns the window
-- leaves out are unsummarized.
-- `before` (optional) lowers the upper bound (a start's own seq); `count`
-- (optional) is the session's finalized turns, the candidates' number
-- when the read's range is all of them; `known` (optional) the meta
-- fields 'st' and 'sh' as the caller read them ({st, sh}, and `sums`:
-- {ts, cs}, for describe); `unpending`
-- (optional) true when no turn is pending but a start's own (`before`).
-- Returns {status 'done'|'more'|'stop', stop reason or '', next before
-- (for 'more'), candidates in range, first or false, flat entries, the
-- summary {text, through seq, SUMMARY header} or false, the unsummarized
-- turns below those returned (see describe) or false, or 'later' (a walk
-- in pages: the caller asks unsummarized.lua once it has selected), and
-- how many of the turns taken the description leaves to a stable
-- window}, each
-- entry (first too) a member, a record, a tail or false, and the English
-- copies or false (loaded whole when the read needs them). The record's
-- header's last field says how much of the question it holds (the member
-- has the whole sizes): a record cut for a truncating read holds the
-- beginnings of the texts; a whole turn with a tail comes as its head and
-- its tail (the rest of the question, then of the answer), to be joined.
-- Hot: per turn, locals only.
-- A page: at most this many turns, and records of at most LOADED bytes
-- (what HMGET copies, whole records even when a truncating read returns
-- their beginnings), so that no call is long; turns handed over for the
-- caller to count, fewer: counting costs the caller more than the walk.
local WALK, LOADED = 1024, 1048576
local HANDOVER, HANDOVER_BYTES = 64, 262144
local BATCH = 64

local WALK_ARGS = '>ddddddddddddc1BBBBBBBBd'

local function walk(at, before, count, now, known, unpending)
  local after, upper_seq, room, max_tokens, max_bytes, max_q, max_a, header,
    inner_sum, ni, nl, bytes, enc, text, keep_first, change, english, copies,
    with_summary, describing, budget, stride = struct.unpack(WALK_ARGS, ARGV[at])
  text, keep_first, change = text == 1, keep_first == 1, change == 1
  english, copies = english == 1, copies == 1
  with_summary, describing = with_summary == 1, describing == 1
  local covered, summary, sums = 0, false, nil
  if with_summary or describing then
    local m = known or redis.call('HMGET', KEYS[1], 'st', 'sh')
    sums = known and known.sums
    covered = tonumber(m[1] or '0')
    if with_summary and m[2] then
      summary = {redis.call('HGET', KEYS[1], 'sm'), m[1], m[2]}
    end
  end
  local encs = enc .. enc
  -- Seqs are below LIVE: the rest of the zset is pending turns.
  if upper_seq < 0 then upper_seq = nil end
  if before and (not upper_seq or before < upper_seq) then upper_seq = before end
  if upper_seq and upper_seq >= tonumber(LIVE) then upper_seq = nil end

  -- A summary comes first: its counts apply when in the read's encoding
  -- (else every turn is handed over, and the caller counts it too).
  local exact = budget == 1
  if summary and after < covered then after = covered end

  local lower = '(' .. after
  local upper = upper_seq and ('(' .. upper_seq) or ('(' .. LIVE)
  local total
  if count and after == 0 and (not upper_seq or upper_seq == before) then
    total = count -- every finalized turn is below a start's own seq
  else
    total = redis.call('ZCOUNT', KEYS[3], lower, upper)
  end
  if summary then
    local _, letter, _, alone, joined, message, sbytes = string.match(summary[3], SUMMARY)
    if exact and letter == enc then
      alone, joined, sbytes = tonumber(alone), tonumber(joined), tonumber(sbytes)
      if not text then
        alone = tonumber(message) + 4
        joined = alone
      end
      local why = false
      if alone > max_tokens then why = 'max_tokens' elseif bytes + sbytes > max_bytes then why = 'max_bytes' end
      if why then return {'stop', why, 0, total, false, {}, summary, 'later'} end
      header, bytes = header + joined, bytes + sbytes
    else
      exact = false
    end
  end
  local cut_q = max_q > 0 and 4 * (max_q + 1) or nil
  local cut_a = max_a > 0 and 4 * (max_a + 1) or nil
  local unpack_costs = struct.unpack
  -- Both encodings as one string, then the counts.
  local FMT = '>c2I4I4I4I4I4I4I4'

  local cap_n, cap_b = WALK, LOADED
  if not exact then cap_n, cap_b = HANDOVER, HANDOVER_BYTES end
  -- Turns taken; for those not read whole from their heads alone:
  -- {question bytes, answer bytes, bytes needed of each}; whether to load
  -- their English copies.
  local taken, notes, en_of, n = {}, {}, {}, 0
  local status, reason, next_before = nil, '', 0
  local walked, page_bytes, loaded, last_m, last_seq = 0, 0, 0, nil, nil
  -- The newest member below those taken, when the walk stopped at it
  -- (see describe's `near`), and its seq.
  local next_m, next_seq = false, nil
  -- For describing what is not returned: text_inner summed over the
  -- taken turns but the reserved first, and the first's seq.
  local run_sum, first_seq = 0, 0

  -- Takes (the stored counts apply and it fits) or hands over (they do not:
  -- the caller counts it) each member, until a page is full or the walk
  -- stops (status says why). One call per batch, not per member: `batch`
  -- is members and their seqs (WITHSCORES).
  local function take(batch)
    for i = 1, #batch, 2 do
      local m = batch[i]
      if walked > 0 and (walked >= cap_n or page_bytes >= cap_b or loaded >= LOADED) then
        status, next_before = 'more', last_seq
        return
      end
      if room <= 0 then
        status, reason, next_m, next_seq = 'stop', 'limit', m, batch[i + 1]
        return
      end
      local e, q, u, an, s, l, qb, ab = unpack_costs(FMT, m, ID + 1)
      -- What the read needs of the original texts (none of a text whose
      -- English copy `lang=en` renders instead), and of the copies.
      local oqb, oab, need_en, copy_bytes = qb, ab, false, 0
      if #m > BASE and (english or copies) then
        local flags, eq, eu, ea, es, el, eqb, eab = unpack_costs(EN_COSTS, m, BASE + 1)
        need_en = true
        if flags % 2 == 1 then copy_bytes = eqb end
        if flags >= 2 then copy_bytes = copy_bytes + eab end
        if english then
          q, u, an, s, l, qb, ab = eq, eu, ea, es, el, eqb, eab
          if flags % 2 == 1 then oqb = 0 end
          if flags >= 2 then oab = 0 end
        end
      end
      if exact and (e ~= encs or (cut_q and qb > max_q) or (cut_a and ab > max_a)) then
        exact, cap_n, cap_b = false, HANDOVER, HANDOVER_BYTES
      end
      if exact then
        local inner, last
        if text then inner, last = u + s, u + l else inner = q + an + 8; last = inner end
        local tokens
        if change then
          tokens = header + inner_sum + (ni >= 0 and ni or 0) + last
        else
          tokens = header + inner_sum + inner + nl
        end
        if tokens > max_tokens then
          status, reason, next_m, next_seq = 'stop', 'max_tokens', m, batch[i + 1]
          return
        end
        if bytes + qb + ab > max_bytes then
          status, reason, next_m, next_seq = 'stop', 'max_bytes', m, batch[i + 1]
          return
        end
        if change then
          if ni >= 0 then inner_sum = inner_sum + ni end
          ni, nl, change = inner, last, false
        else
          inner_sum = inner_sum + inner
        end
        bytes = bytes + qb + ab
      end
      -- What loading it costs: the head alone, unless the read needs more
      -- than it holds; the English copies whole. A turn read whole from
      -- its head alone (the usual) needs no note.
      local q_need, a_need = oqb, oab
      if cut_q and oqb > cut_q then q_need = cut_q end
      if cut_a and oab > cut_a then a_need = cut_a end
      n = n + 1
      taken[n] = m
      if need_en then
        en_of[n] = true
        loaded, page_bytes = loaded + copy_bytes, page_bytes + copy_bytes
      end
      if not need_en and qb <= HEAD and ab <= HEAD then
        loaded = loaded + qb + ab
        if q_need < qb or a_need < ab then notes[n] = {qb, ab, q_need, a_need} end
      else
        local fq, fa = unpack_costs('>I4I4', m, ID + 23)
        if q_need > HEAD or a_need > HEAD then
          loaded = loaded + fq + fa
        else
          loaded = loaded + (fq > HEAD and HEAD or fq) + (fa > HEAD and HEAD or fa)
        end
        notes[n] = {fq, fa, q_need, a_need}
      end
      room = room - 1
      walked, page_bytes, last_m, last_seq = walked + 1, page_bytes + q_need + a_need, m, batch[i + 1]
      run_sum = run_sum + u + s
    end
  end

  local has_first = false
  if keep_first and total > 0 then
    local f = redis.call('ZRANGEBYSCORE', KEYS[3], lower, upper, 'WITHSCORES', 'LIMIT', 0, 1)
    take(f)
    if status then return {status, reason, 0, total, false, {}, summary, 'later'} end
    first_seq, run_sum, last_m, last_seq = tonumber(f[2]), 0, nil, nil
    -- The reserved first turn does not stay the newest, nor fills a page.
    if exact then change = true end
    has_first, walked, page_bytes, loaded = true, 0, 0, 0
    lower = '(' .. f[2]
  end

  local cursor = upper
  while not status do
    local want = BATCH
    if exact and room + 1 < want then want = room + 1 end
    local batch = redis.call('ZREVRANGEBYSCORE', KEYS[3], cursor, lower, 'WITHSCORES', 'LIMIT', 0, want)
    take(batch)
    if status or #batch < 2 * want then break end
    cursor = '(' .. last_seq
  end

  -- The records of what is returned, cut to what a truncating read needs:
  -- heads, and the tails of turns the read needs more of.
  local ids, tails, tail_of, ens, en_at = {}, {}, {}, {}, {}
  for i = 1, n do
    local id = string.sub(taken[i], 1, ID)
    ids[i] = id
    local note = notes[i]
    if note and (note[3] > HEAD or note[4] > HEAD) then
      tails[#tails + 1] = id .. 't'
      tail_of[i] = #tails
    end
    if en_of[i] then
      ens[#ens + 1] = id .. 'e'
      en_at[i] = #ens
    end
  end
  local recs = n > 0 and redis.call('HMGET', KEYS[2], unpack(ids)) or {}
  local tail_recs = #tails > 0 and redis.call('HMGET', KEYS[2], unpack(tails)) or {}
  local en_recs = #ens > 0 and redis.call('HMGET', KEYS[2], unpack(ens)) or {}
  local first, entries = false, {}
  for i = 1, n do
    local m, rec, note = taken[i], recs[i], notes[i]
    if not rec then return redis.error_reply('turnstore: a turn has no record') end
    local tail = false
    if note then
      local qb, ab, q, a = note[1], note[2], note[3], note[4]
      if tail_of[i] then
        tail = tail_recs[tail_of[i]]
        if not tail then return redis.error_reply('turnstore: a turn has no tail') end
      end
      if tail and q == qb and a == ab then
        -- The whole turn: its head and tail go as they are (the caller
        -- joins them; no large copy here), the header saying what the
        -- head holds.
        local prefix, texts = string.match(rec, '^(%d+ %d+ %d+ %S+ )%d+\n()')
        rec = prefix .. math.min(qb, HEAD) .. '\n' .. string.sub(rec, texts)
      else
        rec, tail = assemble(rec, tail, qb, ab, q, a), false
      end
    end
    local en = false
    if en_at[i] then
      en = en_recs[en_at[i]]
      if not en then return redis.error_reply('turnstore: a turn has no English copies') end
    end
    if has_first and i == 1 then
      first = {m, rec, tail, en}
    else
      entries[#entries + 1] = m
      entries[#entries + 1] = rec
      entries[#entries + 1] = tail
      entries[#entries + 1] = en
    end
  end
  -- The unsummarized turns, when this call ends the walk: below what it
  -- returns. A walk that hands turns over describes them as if the caller
  -- takes every one (its caller asks unsummarized.lua when it does not).
  local unsummarized, dropped = 'later', 0
  if describing and not status and after <= covered then
    -- Every turn above `after` was taken, and none lies between what the
    -- summary covers and `after`: nothing is left unsummarized (a
    -- pending turn could only lower the bound).
    unsummarized = false
  elseif describing and status ~= 'more' then
    local below = upper_seq or tonumber(LIVE)
    if last_m then below = tonumber(last_seq) end
    local above = run_sum
    -- What the walk saw below `below`: the candidates but those taken
    -- (the reserved first is among them, below) lie in (after, below).
    local near = {false, next_m, next_seq}
    if after == covered then near[1] = total - n + (has_first and 1 or 0) end
    -- Nothing finalized lies at or above a start's own seq.
    if upper_seq and upper_seq ~= before then above = above + sum_inner(upper_seq, LIVE, english) end
    -- A stable window that the budget stopped shows the run from the
    -- first boundary at or above its oldest turn, when a turn reaches it.
    local newest = 1
    if has_first then newest = 2 end
    if stride > 0 and status == 'stop' and last_m and n >= newest then
      local boundary = math.floor((below - 1 + stride - 1) / stride) * stride + 1
      if below < boundary and tonumber(redis.call('ZSCORE', KEYS[3], taken[newest])) >= boundary then
        dropped = redis.call('ZCOUNT', KEYS[3], below, '(' .. boundary)
        below, above, near = boundary, nil, nil
      end
    end
    unsummarized = describe(covered, below, first_seq, enc, english, above, now, unpending, near, sums)
  end
  return {status or 'done', reason, next_before, total, first, entries, summary, unsummarized, dropped}
end

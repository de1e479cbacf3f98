-- The rules both stores keep, as pure functions: each the twin of the
-- function of the same name in store/rules.rs, which the memory store
-- calls; store/redis/twins/rules.rs runs every pair over random inputs and
-- compares their answers. Owners and users are a string or '' / false
-- (none); times are ms.

-- What a write by `user` ('' for no one) does to a session owned by
-- `owner` (false for no one): 'mismatch' (refused), 'claim' (it becomes
-- the user's) or 'keep'.
local function access(owner, user)
  if owner and user ~= '' and owner ~= user then return 'mismatch' end
  if not owner and user ~= '' then return 'claim' end
  return 'keep'
end

-- Whether a write must (re)write the owner's index entry first: a claim,
-- or an entry (reaching `indexed_until`) that does not reach `needed` past
-- now.
local function index_due(claim, indexed_until, now, needed)
  return claim or indexed_until < now + needed
end

-- The time an index entry is written at: `reach`, but past the user's
-- latest entry (`top`, or nil) and past `min` (a fence).
local function index_time(reach, top, min)
  local t = reach
  if top and top + 1 > t then t = top + 1 end
  if min + 1 > t then t = min + 1 end
  return t
end

-- Whether a start or import moves the owner's entry to the top.
local MOVE_EVERY = 1000
local function moves_to_top(written, moved_at, now)
  return not written and now - moved_at >= MOVE_EVERY
end

-- Whether a session with `live` pending turns takes no other start.
local function pending_full(live, cap)
  return live >= cap
end

-- How many of the oldest finalized turns a write drops (at most TRIM a
-- call: the next calls work a backlog off).
local function excess_turns(count, max_turns)
  return math.max(count - max_turns, 0)
end

-- A summary write's compare-and-set: false (it may be written) or the
-- refusal, {'conflict', stored}, {'beyond', newest} or {'pending', seq}.
-- `expected` -1 and `pending` nil: none.
local function summary_check(stored, expected, through, newest, pending)
  if (expected >= 0 and expected ~= stored) or through < stored then
    return {'conflict', stored}
  end
  if through > newest then return {'beyond', newest} end
  if pending and through >= pending then return {'pending', pending} end
  return false
end

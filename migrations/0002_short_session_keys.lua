-- Migration 0002: layout 1 -> 2. A session's six keys get one-letter
-- suffixes (meta->m, turns->t, order->o, pending->p, deadlines->d, idem->i):
-- every script call names these six keys, and every session stores them.
--
-- Run once per session. KEYS[1..6]: the layout-1 keys, KEYS[7..12]: the
-- layout-2 keys, all under the session's {hash tag} (one slot). RENAME keeps
-- each key's TTL. Idempotent: a key already moved is skipped, so an
-- interrupted run can simply run again.
-- Returns {moved, conflicts}: a conflict is an old key whose new key exists
-- already; both are left as they are for an operator to look at.
local moved, conflicts = 0, 0
for i = 1, 6 do
  if redis.call('EXISTS', KEYS[i]) == 1 then
    if redis.call('EXISTS', KEYS[i + 6]) == 0 then
      redis.call('RENAME', KEYS[i], KEYS[i + 6])
      moved = moved + 1
    else
      conflicts = conflicts + 1
    end
  end
end
return {moved, conflicts}

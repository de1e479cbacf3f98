-- A user's index (KEYS[1]). ARGV: session, time, session, time, ...
-- (at most a few thousand pairs: unpacked whole).
-- Removes each entry that still has the time the caller saw: an entry
-- written since (a new claim, or one moved to the top) stays. Returns
-- those that stay, flat: session, time.
local sessions = {}
for i = 1, #ARGV, 2 do sessions[#sessions + 1] = ARGV[i] end
local times = redis.call('ZMSCORE', KEYS[1], unpack(sessions))
local gone, stay = {}, {}
for i = 1, #sessions do
  local t = times[i]
  if t and tonumber(t) == tonumber(ARGV[2 * i]) then
    gone[#gone + 1] = sessions[i]
  elseif t then
    stay[#stay + 1] = sessions[i]
    stay[#stay + 1] = t
  end
end
if #gone > 0 then redis.call('ZREM', KEYS[1], unpack(gone)) end
return stay

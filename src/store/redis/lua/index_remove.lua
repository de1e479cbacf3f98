-- A user's index (KEYS[1]). ARGV: session, time, session, time, ...
-- Removes each entry that still has the time the caller saw: an entry
-- written since (a new claim) stays. Returns how many went.
local n = 0
for i = 1, #ARGV, 2 do
  local t = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if t and tonumber(t) == tonumber(ARGV[i + 1]) then
    redis.call('ZREM', KEYS[1], ARGV[i])
    n = n + 1
  end
end
return n

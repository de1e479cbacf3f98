-- The session's summarizer lock. ARGV: 1 'take' | 'release', 2 token, 3 ttl
-- ms (take). Returns 1 if taken (or released), 0 if another holds it.
if ARGV[1] == 'take' then
  if redis.call('SET', KEYS[5], ARGV[2], 'NX', 'PX', ARGV[3]) then return 1 end
  return 0
end
if redis.call('GET', KEYS[5]) == ARGV[2] then
  redis.call('DEL', KEYS[5])
  return 1
end
return 0

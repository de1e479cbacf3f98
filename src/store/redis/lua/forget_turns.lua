-- Frees the records of turns an import trimmed (see import.lua): they
-- left the turns zset already. ARGV: at most TRIM turn ids. Frees their
-- idempotency keys if the session ever had keys.
forget(ARGV, redis.call('HGET', KEYS[1], 'keyed'))
return #ARGV

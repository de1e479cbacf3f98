-- Drops a fork attempt's staging (KEYS 6-8 of the new session), if it is
-- still this attempt's (ARGV 1: its token). Returns 1 when it did.
if redis.call('HGET', KEYS[8], 'token') ~= ARGV[1] then return 0 end
redis.call('UNLINK', KEYS[6], KEYS[7], KEYS[8])
return 1

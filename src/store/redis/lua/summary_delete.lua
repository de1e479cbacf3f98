-- Deletes the session's summary and the sums of what it covered.
redis.call('HDEL', KEYS[1], 'sm', 'st', 'sh', 'cs')
return 1

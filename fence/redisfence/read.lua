-- Read a fenced hash. KEYS[1]: the hash. Returns {value, fence}; both are
-- false when the key does not exist.
return redis.call('HMGET', KEYS[1], 'value', 'fence')

-- inspect: read a lock atomically.
-- KEYS[1] lock key, KEYS[2] fence key
-- Returns nil when no lock exists, else {token, pttl, fence or nil}.
local tok = redis.call('GET', KEYS[1])
if not tok then
  return nil
end
return {tok, redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[2])}

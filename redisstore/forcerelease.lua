-- forcerelease: delete a lock whoever holds it (break glass), then wake waiters.
-- KEYS[1] lock key, KEYS[2] fence key
-- ARGV[1] notification channel, ARGV[2] the caller's key
-- Returns nil when no lock exists, else what was deleted: {token, pttl, fence or nil}.
local tok = redis.call('GET', KEYS[1])
if not tok then
  return nil
end
local info = {tok, redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[2])}
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[1], ARGV[2])
return info

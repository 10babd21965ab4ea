-- release: compare-and-DEL, then wake waiters.
-- KEYS[1] lock key
-- ARGV[1] token, ARGV[2] notification channel, ARGV[3] the caller's key
-- Returns 1 when the token owned the lock (now deleted), 0 otherwise.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], ARGV[3])
  return 1
end
return 0

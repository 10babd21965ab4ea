-- renew: compare-and-PEXPIRE.
-- KEYS[1] lock key, KEYS[2] fence key
-- ARGV[1] token, ARGV[2] TTL in ms, ARGV[3] fence key expiry in ms
-- Returns 1 when the token owns the lock, 0 otherwise (nothing changed).
local v = redis.call('GET', KEYS[1])
if v and (string.sub(v, 1, #ARGV[1] + 1) == ARGV[1] .. '|' or v == ARGV[1]) then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
  return 1
end
return 0

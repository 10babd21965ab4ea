-- acquire: take the lock for a token and mint its fence, in one round trip.
-- KEYS[1] lock key   (string: the owner token, with PX = TTL)
-- KEYS[2] fence key  (string: the last fence minted for this key)
-- ARGV[1] token, ARGV[2] TTL in ms, ARGV[3] fence key expiry in ms
-- Returns {1, fence} on success (fence as a decimal string), or {0, pttl}
-- when another token holds the lock.
local cur = redis.call('GET', KEYS[1])
if cur == ARGV[1] then
  -- Our own retry after a lost reply: extend and hand back the same fence.
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  local f = redis.call('GET', KEYS[2])
  if f then
    redis.call('PEXPIRE', KEYS[2], ARGV[3])
    return {1, f}
  end
elseif cur then
  return {0, redis.call('PTTL', KEYS[1])}
end
-- fence = max(last + 1, server time in µs): never backward, even when the
-- counter was lost (restart without persistence, failover, expiry).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local last = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
local fence = string.format('%.0f', math.max(last + 1, now))
redis.call('SET', KEYS[2], fence, 'PX', ARGV[3])
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return {1, fence}

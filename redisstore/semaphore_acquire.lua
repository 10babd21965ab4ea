-- acquire_permit: take one permit for a token and mint its fence, or queue.
-- ARGV[1] token, ARGV[2] TTL ms, ARGV[3] limit, ARGV[4] queue TTL ms (0: never
-- queue), ARGV[5] holder identity, ARGV[6] fence retention ms
-- Returns {1, fence} on a grant, or {0, remaining ms, ahead, holder} where
-- remaining is the TTL of the holder that expires first when every permit
-- is taken (0 otherwise).
local tok, ttl, limit, qttl, retention = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[6])
local now, now_us, start = clock()
prune_holders(now)
redis.call('HSET', KEYS[3], 'limit', limit)
extend(KEYS[3], retention)
local mine = redis.call('HGET', KEYS[2], tok)
if mine then
  -- Our own retry after a lost reply: extend and hand back the same fence.
  redis.call('ZADD', KEYS[1], start + ttl, tok)
  keep_holders(ttl, retention)
  leave(tok)
  return {1, string.match(mine, '^(%d+)')}
end
local n, pos = prune_queue(now, tok)
local free = limit - redis.call('ZCARD', KEYS[1])
local ahead = pos
if pos < 0 then ahead = n end
if ahead < free then
  if pos >= 0 then leave(tok) end
  -- fence = max(last + 1, server time in µs): never backward, also when
  -- the meta key was lost.
  local last = tonumber(redis.call('HGET', KEYS[3], 'fence') or '0') or 0
  local fence = string.format('%.0f', math.max(last + 1, now_us))
  redis.call('HSET', KEYS[3], 'fence', fence)
  redis.call('ZADD', KEYS[1], start + ttl, tok)
  redis.call('HSET', KEYS[2], tok, fence .. '|' .. ARGV[5])
  keep_holders(ttl, retention)
  return {1, fence}
end
if qttl > 0 then
  if pos < 0 then redis.call('RPUSH', KEYS[4], tok) end
  redis.call('HSET', KEYS[5], tok, string.format('%.0f', start + qttl) .. '|' .. ARGV[5])
  extend(KEYS[4], qttl)
  extend(KEYS[5], qttl)
end
local rem, who = 0, ''
if free <= 0 then
  local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  if first[1] then
    rem = tonumber(first[2]) - now
    who = after_bar(redis.call('HGET', KEYS[2], first[1]))
  end
end
return {0, rem, ahead, who}

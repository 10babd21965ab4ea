-- release_permit: free a token's permit, take it out of the queue, wake
-- the waiters whose turn came.
-- ARGV[1] token, ARGV[2] the key's permit channel, ARGV[3] '1' for sharded
-- pub/sub
-- Returns 1 when the token held a live permit, 0 otherwise.
-- Wake-ups: with F = limit - live holders afterwards, the first F live
-- waiters are woken by name (their token published on the channel), and
-- only when a permit was freed or a waiter among the first F before the
-- release left. With an empty queue a freed permit publishes '', which wakes
-- every subscriber of the key. An unknown limit (the meta key gone) wakes
-- every waiter.
local tok = ARGV[1]
local now = clock()
prune_holders(now)
local limit = tonumber(redis.call('HGET', KEYS[3], 'limit') or '')
local n, pos = prune_queue(now, tok)
local free_before = (limit or 0) - redis.call('ZCARD', KEYS[1])
local left = leave(tok)
if pos >= 0 then n = n - 1 end
local held = redis.call('ZREM', KEYS[1], tok)
redis.call('HDEL', KEYS[2], tok)
local function publish(msg)
  if ARGV[3] == '1' then redis.call('SPUBLISH', ARGV[2], msg) else redis.call('PUBLISH', ARGV[2], msg) end
end
if held == 0 and not (left > 0 and pos < free_before) then
  return held
end
if not limit or (held == 1 and n == 0) then
  publish('')
  return held
end
local free = limit - redis.call('ZCARD', KEYS[1])
if n > 0 and free > 0 then
  for _, w in ipairs(redis.call('LRANGE', KEYS[4], 0, free - 1)) do publish(w) end
end
return held

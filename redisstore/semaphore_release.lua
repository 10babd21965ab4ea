-- release_permit: free a token's permit, take it out of the queue, wake
-- the waiters.
-- ARGV[1] token, ARGV[2] the key's permit channel, ARGV[3] '1' for sharded
-- pub/sub
-- Returns 1 when the token held a live permit, 0 otherwise.
local tok = ARGV[1]
local now = clock()
prune_holders(now)
local left = leave(tok)
local held = redis.call('ZREM', KEYS[1], tok)
redis.call('HDEL', KEYS[2], tok)
if held == 1 or left > 0 then
  if ARGV[3] == '1' then redis.call('SPUBLISH', ARGV[2], '') else redis.call('PUBLISH', ARGV[2], '') end
end
return held

-- renew_permit: extend a token's live permit.
-- ARGV[1] token, ARGV[2] TTL ms, ARGV[3] fence retention ms
-- Returns 1 when the token holds a live permit, 0 otherwise.
local tok, ttl = ARGV[1], tonumber(ARGV[2])
local now, _, start = clock()
local exp = redis.call('ZSCORE', KEYS[1], tok)
if not exp or tonumber(exp) <= now then
  prune_holders(now)
  return 0
end
redis.call('ZADD', KEYS[1], 'XX', start + ttl, tok)
keep_holders(ttl, tonumber(ARGV[3]))
return 1

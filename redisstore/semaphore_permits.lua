-- permits: describe a semaphore.
-- Returns {limit, waiting, head holder, {token, remaining ms, "fence|holder"}...}.
local now = clock()
prune_holders(now)
local n, _, head = prune_queue(now, '')
local out = {tonumber(redis.call('HGET', KEYS[3], 'limit') or '0') or 0, n, after_bar(head)}
local hs = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
for i = 1, #hs, 2 do
  out[#out + 1] = hs[i]
  out[#out + 1] = tonumber(hs[i + 1]) - now
  out[#out + 1] = redis.call('HGET', KEYS[2], hs[i]) or ''
end
return out

-- refresh: keeps waiters' places: each queue entry's deadline moves to now +
-- the queue TTL (never back). It never creates an entry and never grants.
-- KEYS[2i-1] lock key, KEYS[2i] queue key of place i (see acquire.lua); one
-- place per call on a Cluster, where keys of one call share a slot
-- ARGV[1] queue TTL ms, ARGV[1+i] the token of place i
-- Returns one code per place: 0 when the token has no live entry, else 1
-- while the lock exists and 2 when it does not (the waiter should acquire).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[1])
local out = {}
for i = 1, #KEYS / 2 do
  local lk, qk, token = KEYS[2 * i - 1], KEYS[2 * i], ARGV[i + 1]
  -- HGETALL, not HGET, which the documented ACL does not grant; the
  -- acquire it replaces read the whole queue too.
  local raw, v = redis.call('HGETALL', qk), nil
  for j = 1, #raw, 2 do
    if raw[j] == token then v = raw[j + 1] break end
  end
  local seq, dl, rest
  if v then seq, dl, rest = string.match(v, '^(%d+)|(%d+)|(.*)$') end
  if not seq or tonumber(dl) <= now then
    out[i] = 0
  else
    if now + ttl > tonumber(dl) then
      redis.call('HSET', qk, token, seq .. '|' .. string.format('%d', now + ttl) .. '|' .. rest)
      redis.call('PEXPIRE', qk, ttl, 'GT')
    end
    out[i] = 2 - redis.call('EXISTS', lk)
  end
end
return out

-- refresh: keeps waiters' places: each queue entry's deadline moves to now +
-- the queue TTL (never back). It never creates an entry and never grants.
-- KEYS[3i-2] lock key, KEYS[3i-1] queue key, KEYS[3i] order key of place i
-- (see acquire.lua); one place per call on a Cluster, where keys of one
-- call share a slot
-- ARGV[1] queue TTL ms, ARGV[1+i] the token of place i
-- Returns one code per place: 0 when the token has no live entry, else 1
-- while the lock exists and 2 when it does not (the waiter should acquire).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[1])
local out = {}
for i = 1, #KEYS / 3 do
  local lk, qk, ok, token = KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i], ARGV[i + 1]
  local v = redis.call('HGET', qk, token)
  local seq, dl, rest
  if v then seq, dl, rest = string.match(v, '^(%d+)|(%d+)|(.*)$') end
  if not seq or tonumber(dl) <= now then
    out[i] = 0
  else
    if now + ttl > tonumber(dl) then
      redis.call('HSET', qk, token, seq .. '|' .. string.format('%d', now + ttl) .. '|' .. rest)
      redis.call('PEXPIRE', qk, ttl, 'GT')
      redis.call('PEXPIRE', ok, ttl, 'GT')
    end
    out[i] = 2 - redis.call('EXISTS', lk)
  end
end
return out

-- refresh: keeps a waiter's place: its queue entry's deadline moves to now +
-- the queue TTL (never back). It never creates an entry and never grants.
-- KEYS[1] lock key, KEYS[2] queue key (see acquire.lua)
-- ARGV[1] token, ARGV[2] queue TTL ms
-- Returns 0 when the token has no live entry, else 1 while the lock exists
-- and 2 when it does not (the waiter should acquire).
local v = redis.call('HGET', KEYS[2], ARGV[1])
if not v then return 0 end
local seq, dl, rest = string.match(v, '^(%d+)|(%d+)|(.*)$')
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if not seq or tonumber(dl) <= now then return 0 end
local ndl = now + tonumber(ARGV[2])
if ndl > tonumber(dl) then
  redis.call('HSET', KEYS[2], ARGV[1], seq .. '|' .. string.format('%d', ndl) .. '|' .. rest)
  redis.call('PEXPIRE', KEYS[2], ARGV[2], 'GT')
end
if redis.call('EXISTS', KEYS[1]) == 1 then return 1 end
return 2

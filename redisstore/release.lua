-- release: compare-and-DEL, leave the queue, wake the head, in one round trip.
-- KEYS[1] lock key, KEYS[2] queue key
-- ARGV[1] the key's channel, ARGV[2] '1' for sharded pub/sub, ARGV[3] token
-- Returns 1 when the token held the lock (now deleted), 2 when another token
-- holds it (left alone), 0 when nobody holds it. The head of the queue is
-- woken when the key is free afterwards and the head is new: after a
-- release, or when the departing token was the head. With no queue a
-- release wakes every subscriber of the key (waiters that did not queue).
local token = ARGV[3]
local v = redis.call('GET', KEYS[1])
local res = 0
if v then
  if string.sub(v, 1, #token + 1) == token .. '|' or v == token then
    redis.call('DEL', KEYS[1])
    res = 1
  else
    res = 2
  end
end
if redis.call('EXISTS', KEYS[2]) == 0 then
  if res == 1 then -- nobody queued: wake whoever subscribed without queueing
    if ARGV[2] == '1' then redis.call('SPUBLISH', ARGV[1], '') else redis.call('PUBLISH', ARGV[1], '') end
  end
  return res
end

-- @lib

local _, nowms = clock()
local live = load_queue(KEYS[2], nowms, true)
local pos = position(live, token)
if pos then
  table.remove(live, pos)
  if #live == 0 then redis.call('DEL', KEYS[2]) else redis.call('HDEL', KEYS[2], token) end
end
if #live > 0 and (res == 1 or (res == 0 and pos == 1)) then notify(live[1][1]) end
return res

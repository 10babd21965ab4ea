-- release: compare-and-DEL, leave the queue, and hand the key to the head
-- waiter, in one round trip.
-- KEYS[1] lock key, KEYS[2] queue key, KEYS[3] fence key, KEYS[4] released key
-- (PREFIX{TAG}:released:TOKEN, one per token, so that no later release overwrites it),
-- KEYS[5] order key (see acquire.lua)
-- ARGV[1] the key's channel, ARGV[2] '1' for sharded pub/sub, ARGV[3] token,
-- ARGV[4] fence key retention ms (added to the granted TTL), ARGV[5] how long
-- the released key remembers the token (ms)
-- Returns 1 when the token held the lock (now deleted), 2 when another token
-- holds it (left alone), 0 when nobody holds it.
-- A release that changed the key records its answer in its released key
-- (1, or 0 for a head that gave up and handed a free key on): a retry of it
-- (go-redis resends a script whose reply was lost) that then finds the head
-- holding the key, or the key taken by anyone, answers as the release it
-- repeats did, instead of 2.
-- When the key is free afterwards and the head is new (after a release, or
-- when the departing token was the head), the head is granted the key here:
-- the lock is set to its token and holder with PX = min(its TTL, its queue
-- deadline - now), so a waiter that died holds the key no longer than its
-- queue place would have, with a fresh fence by the acquire rules, and
-- "TOKEN|FENCE|TTL_MS" is published to the head's process (lib.lua notify).
-- An entry without a TTL (an older client queued it), or a fence key that
-- holds no fence, only wakes the head: "TOKEN". With no queue a release
-- wakes every waiter and observer of the key: "" on its channel. Observers
-- get the messages addressed to one process on PREFIX{TAG}:watch.
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
if res == 2 then -- a retry of an applied release answers as it did
  local rec = redis.call('GET', KEYS[4])
  if rec == '0' then return 0 end
  if rec then return 1 end
end
if res == 1 then redis.call('SET', KEYS[4], '1', 'PX', ARGV[5]) end
if redis.call('EXISTS', KEYS[5]) == 0 then
  if res == 1 then -- nobody queued: wake whoever subscribed without queueing, and the observers
    if ARGV[2] == '1' then redis.call('SPUBLISH', ARGV[1], '') else redis.call('PUBLISH', ARGV[1], '') end
  end
  return res
end

-- @lib

local now, nowms = clock()
local first, ev, dl = head(KEYS[2], KEYS[5], nowms)
local was_head = first == token
drop(KEYS[2], KEYS[5], token)
if not (res == 1 or (res == 0 and was_head)) then return res end
if res == 0 then redis.call('SET', KEYS[4], '0', 'PX', ARGV[5]) end -- a head that gave up hands the key on
if was_head then first, ev, dl = head(KEYS[2], KEYS[5], nowms) end
if not first then return res end

local holder, ttl, wake = details(ev)
if ttl and ttl > 0 then
  local f = mint_fence(KEYS[3], now, ttl + tonumber(ARGV[4]))
  if f then
    local hv = first
    if holder ~= '' then hv = hv .. '|' .. holder end
    redis.call('SET', KEYS[1], hv, 'PX', math.min(ttl, dl - nowms))
    drop(KEYS[2], KEYS[5], first)
    notify(first .. '|' .. f .. '|' .. ttl, wake, ARGV[1], ARGV[2])
    return res
  end
end
notify(first, wake, ARGV[1], ARGV[2])
return res

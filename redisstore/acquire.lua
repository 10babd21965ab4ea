-- acquire: the queue rule, SET PX with the holder, and the fence, in one round trip.
-- KEYS[1] lock key  (string "token|holder", PX = TTL)
-- KEYS[2] fence key (string: the last fence minted for the key, a decimal uint64)
-- KEYS[3] queue key (hash: token -> "seq|deadline ms|TTL ms|wake|holder")
-- KEYS[4] order key (sorted set: token -> seq; lib.lua). Both keys expire
--         at their latest deadline, so they vanish with their last waiter.
-- ARGV[1] lock value (TOKEN|HOLDER, or TOKEN), ARGV[2] TTL ms, ARGV[3]
-- "FENCE_EXPIRY_MS|QUEUE_TTL_MS|WAKE|KEPT_MS|SHARDED": the fence key's
-- expiry, the queue TTL (0: never queue), the suffix of the waiter's
-- process channel (CHANNEL:WAKE), how long a place kept by the process's
-- presence lives (0: not kept; lib.lua) and '1' for sharded pub/sub. (Ten
-- words in all: Redis
-- answers a longer command from a client that has not authenticated with a
-- protocol error instead of NOAUTH.)
-- Returns the fence (a decimal string) on a grant, or {0, pttl, holder, ahead} when refused:
-- pttl is the holder's remaining TTL (0 when the key is free but waiters are ahead).
local value, ttl, fexp = ARGV[1], ARGV[2], string.match(ARGV[3], '^%d+')

-- The fast path, with no helper defined yet (each closure costs on every
-- call): no queue, a free key, a fence counter behind the clock.
local fresh -- the clock when SET NX took the lock but the fence needs the careful path
if redis.call('EXISTS', KEYS[4]) == 0 then
  local old = redis.call('SET', KEYS[1], value, 'NX', 'PX', ttl, 'GET')
  if not old then
    local t = redis.call('TIME')
    local now = t[1] .. string.sub('00000' .. t[2], -6)
    local last = redis.pcall('SET', KEYS[2], now, 'PX', fexp, 'GET')
    if not last or (type(last) == 'string' and (#last < #now or (#last == #now and last < now)) and string.find(last, '^[1-9]%d*$')) then
      return now
    end
    redis.call('DEL', KEYS[1]) -- the careful path below decides, or fails without a lock left behind
    if type(last) == 'table' then return last end -- WRONGTYPE
    redis.call('SET', KEYS[2], last, 'PX', fexp)
    fresh = now
  end
end

-- @lib

local token = string.match(value, '^[^|]*')
local qttl, wake, kept, sharded = string.match(ARGV[3], '^%d+|(%d+)|(%x*)|(%d+)|([01])$')
qttl, kept = tonumber(qttl) or 0, tonumber(kept) or 0
if kept > 0 and wake ~= '' then
  -- A presence lost with the data (a restart, FLUSHALL) comes back for the
  -- queue TTL, so the place is live at once: the waiters that re-check at
  -- the reconnect would otherwise drop each other's places before their
  -- Lockers keep the presence again.
  redis.call('SET', string.match(KEYS[3], '^(.*){') .. 'present:' .. wake, '1', 'PX', qttl, 'NX')
  qttl, wake = kept, wake .. '*'
end

-- grant takes the lock (already SET) and mints its fence; a bad fence key
-- undoes the SET so nothing is left behind.
local function grant(now)
  local f, err = mint_fence(KEYS[2], now, fexp)
  if not f then
    redis.call('DEL', KEYS[1])
    return err
  end
  return f
end

-- again is a retry by the holder after a lost reply: same fence, new TTL.
local function again()
  redis.call('PEXPIRE', KEYS[1], ttl)
  local f = redis.call('GET', KEYS[2])
  if not f then
    return grant((clock())) -- the counter is gone: a new fence from the clock floor
  end
  if not fence_ok(f) then return bad(KEYS[2], 'holds ' .. string.format('%q', string.sub(f, 1, 40)) .. ', not a fence') end
  redis.call('PEXPIRE', KEYS[2], fexp)
  return f
end

-- keep makes key k live at least ms more.
local function keep(k, ms)
  if redis.call('PEXPIRE', k, ms, 'GT') == 0 and redis.call('PTTL', k) == -1 then
    redis.call('PEXPIRE', k, ms)
  end
end

-- enqueue adds token behind the last entry (or refreshes its place, its
-- live entry mine) until now + qttl. A place kept by the presence stays
-- kept, its deadline never earlier: an acquire without Kept that Redis
-- applies after a later refresh with Kept must not shorten the place its
-- Locker counts as kept.
local function enqueue(mine, nowms)
  local seq, dl, w = nil, nowms + qttl, wake
  if mine then
    seq = string.match(mine, '^%d+')
    local odl = string.match(mine, '^%d+|(%d+)|%d+|%x+%*|')
    if odl and string.sub(w, -1) ~= '*' then dl, w = math.max(dl, tonumber(odl)), w .. '*' end
  else
    seq = (tonumber(redis.call('ZRANGE', KEYS[4], -1, -1, 'WITHSCORES')[2]) or 0) + 1
    redis.call('ZADD', KEYS[4], seq, token)
  end
  redis.call('HSET', KEYS[3], token, string.format('%d|%d|%d|%s|', seq, dl, ttl, w) .. holder_of(value))
  keep(KEYS[3], qttl)
  keep(KEYS[4], qttl)
end

local function pttl_of()
  local pttl = redis.call('PTTL', KEYS[1])
  if pttl < 0 then return nil end
  return pttl
end

if fresh then
  redis.call('SET', KEYS[1], value, 'PX', ttl)
  return grant(fresh)
end

-- The general path: the key goes only to the head of its queue.
local cur = redis.call('GET', KEYS[1])
if cur and owns(cur, token) then
  drop(KEYS[3], KEYS[4], token)
  return again()
end
local now, nowms = clock()
local first, fv, fdl = head(KEYS[3], KEYS[4], nowms)
local mine = fv
if first ~= token then mine = first and live(redis.call('HGET', KEYS[3], token), nowms, KEYS[3]) end

-- ahead is the number of entries ahead of token (all of them when it has
-- no live entry); dead entries behind the head count until they reach it.
local function ahead()
  if not first or first == token then return 0 end
  if mine then return redis.call('ZRANK', KEYS[4], token) end
  return redis.call('ZCARD', KEYS[4])
end

if cur then
  local pttl = pttl_of()
  if not pttl then return bad(KEYS[1], 'has no expiry') end
  local n = ahead()
  if qttl > 0 then enqueue(mine, nowms) end
  return {0, pttl, holder_of(cur), n}
end
if not first or first == token then
  if first then drop(KEYS[3], KEYS[4], token) end
  redis.call('SET', KEYS[1], value, 'PX', ttl)
  return grant(now)
end
local n = ahead()

-- A free key whose head is kept by its process's presence is handed to the
-- head here, as a release would: the head may be a place its process
-- forgot (an acquire applied after its clean-up release), which would
-- otherwise hold up the queue until its deadline.
local pttl, holder, httl, hwake = 0, '', nil, nil
if string.find(fv, '^%d+|%d+|%d+|%x+%*|') then holder, httl, hwake = details(fv) end
if httl and httl > 0 then
  local f = mint_fence(KEYS[2], now, httl + tonumber(fexp) - tonumber(ttl))
  if f then
    pttl = math.min(httl, fdl - nowms)
    local hv = first
    if holder ~= '' then hv = hv .. '|' .. holder end
    redis.call('SET', KEYS[1], hv, 'PX', pttl)
    drop(KEYS[3], KEYS[4], first)
    n = n - 1
    local chan = string.sub(KEYS[3], 1, -6) .. 'wake'
    notify(first .. '|' .. f .. '|' .. httl, hwake, chan, sharded)
  else
    holder = ''
  end
end
if qttl > 0 then enqueue(mine, nowms) end
return {0, pttl, holder, n}

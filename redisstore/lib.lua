-- lib: helpers prepended to every script (one chunk per script, so Redis
-- caches each script whole). Fences are decimal strings and never Lua
-- numbers: a double is exact only up to 2^53.
local MAXFENCE = '18446744073709551615' -- uint64

-- fence_ok reports whether s is a canonical decimal uint64.
local function fence_ok(s)
  if not string.find(s, '^[1-9]%d*$') or #s > 20 then return s == '0' end
  return #s < 20 or s <= MAXFENCE
end

-- less compares two canonical decimals.
local function less(a, b)
  if #a ~= #b then return #a < #b end
  return a < b
end

-- incr returns s + 1.
local function incr(s)
  local i = #s
  while i > 0 and string.byte(s, i) == 57 do i = i - 1 end
  if i == 0 then return '1' .. string.rep('0', #s) end
  return string.sub(s, 1, i - 1) .. string.char(string.byte(s, i) + 1) .. string.rep('0', #s - i)
end

-- bad fails the script with a BADENTRY error naming the Redis key.
local function bad(key, what)
  return redis.error_reply('BADENTRY ' .. key .. ' ' .. what)
end

-- owns reports whether the lock value v ("token|holder") is token's; a
-- bare "token" (written by leasehold before holders were stored) counts.
local function owns(v, token)
  return string.sub(v, 1, #token + 1) == token .. '|' or v == token
end

-- holder_of returns the holder part of a lock value.
local function holder_of(v)
  local i = string.find(v, '|', 1, true)
  if i then return string.sub(v, i + 1) end
  return ''
end

-- clock returns Redis TIME as µs (a decimal string) and as ms (a number).
local function clock()
  local t = redis.call('TIME')
  return t[1] .. string.rep('0', 6 - #t[2]) .. t[2], tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- The queue of a key is two keys in its hash slot: the hash
-- PREFIX{TAG}:queue, token -> "seq|deadline ms|ttl ms|wake|holder", and the
-- sorted set PREFIX{TAG}:order, token -> seq, whose first member is the
-- head. An entry is live until its deadline (Redis TIME); the scripts skip
-- and delete dead entries as they reach the head. An entry whose wake ends
-- in '*' is kept by its process's presence, the key PREFIX + 'present:' +
-- wake (PREFIX: the queue key's name before its hash tag): it lives until
-- the earlier of its deadline and the presence's expiry. An entry of an
-- older client reads "seq|deadline ms|holder".

-- live returns entry v of queue qk and its deadline when v is live at nowms.
local function live(v, nowms, qk)
  local dl = v and tonumber(string.match(v, '^%d+|(%d+)|'))
  if not dl or dl <= nowms then return end
  local w = string.match(v, '^%d+|%d+|%d+|(%x+)%*|')
  if w then
    local p = redis.call('PTTL', string.match(qk, '^(.*){') .. 'present:' .. w)
    if p == -2 or p == 0 then return end
    if p > 0 then dl = math.min(dl, nowms + p) end
  end
  return v, dl
end

-- drop removes token t from the queue.
local function drop(qk, ok, t)
  if redis.call('ZREM', ok, t) == 1 then redis.call('HDEL', qk, t) end
end

-- head returns the first live entry (token, value, deadline; nil when
-- none is left), deleting the dead ones before it.
local function head(qk, ok, nowms)
  while true do
    local t = redis.call('ZRANGE', ok, 0, 0)[1]
    if not t then return nil end
    local v, dl = live(redis.call('HGET', qk, t), nowms, qk)
    if v then return t, v, dl end
    drop(qk, ok, t)
  end
end

-- survey returns the number of live entries and the first of them (token,
-- value), reading every entry (inspect, forcerelease).
local function survey(qk, ok, nowms)
  local n, first, fv = 0, nil, nil
  for _, t in ipairs(redis.call('ZRANGE', ok, 0, -1)) do
    local v = live(redis.call('HGET', qk, t), nowms, qk)
    if v then
      if n == 0 then first, fv = t, v end
      n = n + 1
    end
  end
  return n, first, fv
end

-- details returns the holder of entry v, the lock TTL it asked for (ms) and
-- the suffix of its process's channel; TTL and suffix are nil in an entry
-- of an older client.
local function details(v)
  local ttl, wake, h = string.match(v, '^%d+|%d+|(%d+)|(%x*)%*?|(.*)$')
  if not ttl then return string.match(v, '^%d+|%d+|(.*)$'), nil, nil end
  return h, tonumber(ttl), wake
end

-- mint_fence stores in fk (expiring in fexp ms) and returns the next fence:
-- max(last + 1, now in µs). It returns nil and a BADENTRY error when fk
-- holds no fence below 2^64-1.
local function mint_fence(fk, now, fexp)
  local last = redis.call('GET', fk)
  local f = now
  if last then
    if not fence_ok(last) or last == MAXFENCE then
      return nil, bad(fk, 'holds ' .. string.format('%q', string.sub(last, 1, 40)) .. ', not a fence below 2^64-1')
    end
    local n = incr(last)
    if less(now, n) then f = n end
  end
  redis.call('SET', fk, f, 'PX', fexp)
  return f
end

-- notify publishes msg (a token, a grant "TOKEN|FENCE|TTL_MS", or '' for
-- every waiter) on the channel of the waiter's process (CHANNEL:WAKE) when
-- its queue entry names one, so that the other processes waiting on the key
-- are not woken, and then on the key's observer channel
-- (PREFIX{TAG}:watch); else on the key's channel, which every waiter and
-- observer subscribes. chan is the key's channel (PREFIX{TAG}:wake),
-- sharded '1' for sharded pub/sub (Cluster).
local function notify(msg, wake, chan, sharded)
  local pub = 'PUBLISH'
  if sharded == '1' then pub = 'SPUBLISH' end
  if wake and wake ~= '' then
    redis.call(pub, chan .. ':' .. wake, msg)
    redis.call(pub, string.sub(chan, 1, -5) .. 'watch', msg)
  else
    redis.call(pub, chan, msg)
  end
end

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

-- load_queue returns the live entries of the queue hash (token ->
-- "seq|deadline ms|ttl ms|wake|holder", field "#" the last seq), in no
-- particular order, as {token, seq, deadline, value}: only seq and deadline
-- are parsed here (head_of, find and details read the rest when needed), so
-- that a script that needs only the head pays for no more. An entry of an
-- older client reads "seq|deadline ms|holder".
-- With prune it deletes dead or unreadable entries (and the hash when none is left).
local function load_queue(qk, nowms, prune)
  local raw = redis.call('HGETALL', qk)
  local live, dead = {}, {}
  for i = 1, #raw, 2 do
    local f = raw[i]
    if f ~= '#' then
      local v = raw[i + 1]
      local seq, dl = string.match(v, '^(%d+)|(%d+)|')
      if seq and tonumber(dl) > nowms then
        live[#live + 1] = {f, tonumber(seq), tonumber(dl), v}
      else
        dead[#dead + 1] = f
      end
    end
  end
  if prune then
    if #live == 0 then
      if #raw > 0 then redis.call('DEL', qk) end
    elseif #dead > 0 then
      redis.call('HDEL', qk, unpack(dead))
    end
  end
  return live
end

-- head_of returns the entry of live with the lowest seq (nil when empty).
local function head_of(live)
  local h = live[1]
  for i = 2, #live do
    if live[i][2] < h[2] then h = live[i] end
  end
  return h
end

-- find returns token's index in live (nil when absent) and the number of
-- live entries ahead of it (all of them when absent).
local function find(live, token)
  for i, e in ipairs(live) do
    if e[1] == token then
      local ahead = 0
      for _, x in ipairs(live) do
        if x[2] < e[2] then ahead = ahead + 1 end
      end
      return i, ahead
    end
  end
  return nil, #live
end

-- details returns an entry's holder, the lock TTL it asked for (ms) and the
-- suffix of its process's channel; TTL and suffix are nil in an entry of an
-- older client.
local function details(e)
  local ttl, wake, h = string.match(e[4], '^%d+|%d+|(%d+)|(%x*)|(.*)$')
  if not ttl then return string.match(e[4], '^%d+|%d+|(.*)$'), nil, nil end
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
-- observer subscribes. ARGV[1] is the key's channel (PREFIX{TAG}:wake),
-- ARGV[2] '1' for sharded pub/sub (Cluster).
local function notify(msg, wake)
  local pub = 'PUBLISH'
  if ARGV[2] == '1' then pub = 'SPUBLISH' end
  if wake and wake ~= '' then
    redis.call(pub, ARGV[1] .. ':' .. wake, msg)
    redis.call(pub, string.sub(ARGV[1], 1, -5) .. 'watch', msg)
  else
    redis.call(pub, ARGV[1], msg)
  end
end

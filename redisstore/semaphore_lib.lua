-- Shared prelude of the semaphore scripts (prepended to each of them).
-- KEYS[1] holders ZSET  PREFIX{KEY}:sem:holders  member token, score expiry (ms, server time)
-- KEYS[2] info    HASH  PREFIX{KEY}:sem:info     token -> "fence|holder identity"
-- KEYS[3] meta    HASH  PREFIX{KEY}:sem:meta     fence (last minted), limit (last seen)
-- KEYS[4] queue   LIST  PREFIX{KEY}:sem:queue    waiting tokens, FIFO
-- KEYS[5] waiters HASH  PREFIX{KEY}:sem:waiters  token -> "queue deadline ms|holder identity"
-- Every key of one semaphore carries the same hash tag: one slot on a Cluster.

-- clock returns the server time in ms rounded down (to decide what has
-- expired), in µs (the fence floor), and in ms rounded up (to start a TTL
-- from: an expiry is never earlier than grant time + TTL).
local function clock()
  local t = redis.call('TIME')
  local s, us = tonumber(t[1]), tonumber(t[2])
  return s * 1000 + math.floor(us / 1000), s * 1000000 + us, s * 1000 + math.ceil(us / 1000)
end

-- extend makes key live at least ms more (keys that do not exist are left).
local function extend(key, ms)
  local p = redis.call('PTTL', key)
  if p == -1 or (p >= 0 and p < ms) then
    redis.call('PEXPIRE', key, ms)
  end
end

-- prune_holders drops the holders whose TTL ran out: a crashed holder's
-- permit comes back inside the next operation, with no sweeper.
local function prune_holders(now)
  local gone = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)
  if #gone > 0 then
    redis.call('HDEL', KEYS[2], unpack(gone))
    redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
  end
end

-- prune_queue drops expired waiters and returns the number of live ones,
-- tok's 0-based position among them (-1 when absent) and the head's entry.
local function prune_queue(now, tok)
  local q = redis.call('LRANGE', KEYS[4], 0, -1)
  local n, pos, head = 0, -1, nil
  for _, w in ipairs(q) do
    local v = redis.call('HGET', KEYS[5], w)
    local dl = v and tonumber(string.match(v, '^(%d+)'))
    if dl and dl > now then
      if w == tok then pos = n end
      if not head then head = v end
      n = n + 1
    else
      redis.call('LREM', KEYS[4], 1, w)
      redis.call('HDEL', KEYS[5], w)
    end
  end
  return n, pos, head
end

-- leave removes tok from the queue; returns 1 if it was there.
local function leave(tok)
  redis.call('HDEL', KEYS[5], tok)
  return redis.call('LREM', KEYS[4], 1, tok)
end

-- after_bar returns what follows the first '|' of v.
local function after_bar(v)
  return string.match(v or '', '^[^|]*|(.*)$') or ''
end

-- keep_holders keeps the holder keys alive for ttl ms and the fence floor
-- for ttl + retention ms.
local function keep_holders(ttl, retention)
  extend(KEYS[1], ttl)
  extend(KEYS[2], ttl)
  extend(KEYS[3], ttl + retention)
end

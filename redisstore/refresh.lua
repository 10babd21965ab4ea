-- refresh: keeps waiters' places: each queue entry's deadline moves to now +
-- the queue TTL, or now + KEPT for a place kept by its process's presence
-- (lib.lua), never back; a place once kept by the presence stays kept. It
-- never creates an entry and never grants.
-- KEYS[3i-2] lock key, KEYS[3i-1] queue key, KEYS[3i] order key of place i
-- (see acquire.lua); one place per call on a Cluster, where keys of one
-- call share a slot
-- ARGV[1] "QUEUE_TTL_MS|KEPT_MS" (KEPT_MS 0: not kept by presence), ARGV[1+i]
-- the token of place i
-- Returns one code per place: 0 when the token has no live entry, else 1
-- while the lock exists and 2 when it does not (the waiter should acquire).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local qttl, kept = string.match(ARGV[1], '^(%d+)|(%d+)$')
qttl, kept = tonumber(qttl), tonumber(kept)
local present = {} -- a presence's PTTL, read once per call
local out = {}
for i = 1, #KEYS / 3 do
  local lk, qk, ok, token = KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i], ARGV[i + 1]
  local v = redis.call('HGET', qk, token)
  local seq, dl, ttl, wake, star, rest
  if v then seq, dl, ttl, wake, star, rest = string.match(v, '^(%d+)|(%d+)|(%d+)|(%x*)(%*?)|(.*)$') end
  local alive = seq and tonumber(dl) > now
  if alive and star == '*' then
    local p = present[wake]
    if not p then
      p = redis.call('PTTL', string.match(qk, '^(.*){') .. 'present:' .. wake)
      present[wake] = p
    end
    alive = p ~= -2 and p ~= 0
  end
  if not alive then
    out[i] = 0
  else
    local keep, mark = qttl, ''
    if kept > 0 and wake ~= '' then
      keep, mark = kept, '*'
    elseif star == '*' then
      mark = '*' -- a refresh without Kept applied late never unkeeps a place
    end
    if now + keep > tonumber(dl) or mark ~= star then
      redis.call('HSET', qk, token, seq .. '|' .. string.format('%d', now + keep) .. '|' .. ttl .. '|' .. wake .. mark .. '|' .. rest)
      redis.call('PEXPIRE', qk, keep, 'GT')
      redis.call('PEXPIRE', ok, keep, 'GT')
    end
    out[i] = 2 - redis.call('EXISTS', lk)
  end
end
return out

-- forcerelease: delete a lock whoever holds it (break glass) and wake the head.
-- KEYS[1] lock key, KEYS[2] fence key, KEYS[3] queue key, KEYS[4] order key
-- ARGV[1] the key's channel, ARGV[2] '1' for sharded pub/sub
-- Returns nil when no lock exists, else what was deleted:
-- {value, pttl, fence or nil, waiting, next holder, repaired}. A fence key
-- that holds no fence below 2^64-1 is deleted too (repaired = 1), so the key
-- works again: the next fence comes from the clock floor.
-- @lib
local v = redis.call('GET', KEYS[1])
if not v then return nil end
local info = {v, redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[2]), 0, '', 0}
redis.call('DEL', KEYS[1])
if info[3] and (not fence_ok(info[3]) or info[3] == MAXFENCE) then
  redis.call('DEL', KEYS[2])
  info[6] = 1
end
if redis.call('EXISTS', KEYS[4]) == 1 then
  local _, nowms = clock()
  local n, first, fv = survey(KEYS[3], KEYS[4], nowms)
  if n > 0 then
    local holder, _, wake = details(fv)
    info[4], info[5] = n, holder
    notify(first, wake, ARGV[1], ARGV[2])
    return info
  end
end
notify('', nil, ARGV[1], ARGV[2])
return info

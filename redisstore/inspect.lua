-- inspect: read a lock and its queue atomically (read only).
-- KEYS[1] lock key, KEYS[2] fence key, KEYS[3] queue key, KEYS[4] order key
-- Returns nil when no lock exists, else {value, pttl, fence or nil, waiting, next holder}.
-- @lib
local v = redis.call('GET', KEYS[1])
if not v then return nil end
local waiting, nexth = 0, ''
if redis.call('EXISTS', KEYS[4]) == 1 then
  local _, nowms = clock()
  local _, fv
  waiting, _, fv = survey(KEYS[3], KEYS[4], nowms)
  if fv then nexth = details(fv) end
end
return {v, redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[2]), waiting, nexth}

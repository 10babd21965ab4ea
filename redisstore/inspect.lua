-- inspect: read a lock and its queue atomically (read only).
-- KEYS[1] lock key, KEYS[2] fence key, KEYS[3] queue key
-- Returns nil when no lock exists, else {value, pttl, fence or nil, waiting, next holder}.
-- @lib
local v = redis.call('GET', KEYS[1])
if not v then return nil end
local waiting, nexth = 0, ''
if redis.call('EXISTS', KEYS[3]) == 1 then
  local _, nowms = clock()
  local live = load_queue(KEYS[3], nowms, false)
  waiting = #live
  if waiting > 0 then nexth = details(head_of(live)) end
end
return {v, redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[2]), waiting, nexth}

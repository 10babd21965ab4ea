-- Fenced write of a hash {value, fence}.
-- KEYS[1]: the hash. ARGV[1]: the write's fence, decimal without leading
-- zeros. ARGV[2]: the value. ARGV[3]: expiry in milliseconds, 0 for none.
-- Fences are compared as decimal strings (length, then bytes), so every
-- uint64 compares exactly; Lua numbers would lose precision above 2^53.
-- Returns {1, fence} when applied and {0, stored fence} when ARGV[1] is
-- lower than the stored fence (nothing changes).
local stored = redis.call('HGET', KEYS[1], 'fence')
local fence = ARGV[1]
if stored and (#fence < #stored or (#fence == #stored and fence < stored)) then
	return {0, stored}
end
redis.call('HSET', KEYS[1], 'value', ARGV[2], 'fence', fence)
local ttl = tonumber(ARGV[3])
if ttl > 0 then
	redis.call('PEXPIRE', KEYS[1], ttl)
end
return {1, fence}

-- in_use.lua: how many live holds one ledger has, by the Redis clock.
--
-- KEYS[1]  ledger
-- ARGV     none
--
-- Returns an integer: members whose expiry is still ahead. Read-only.

local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
return redis.call('ZCOUNT', KEYS[1], '(' .. string.format('%.0f', now), '+inf')

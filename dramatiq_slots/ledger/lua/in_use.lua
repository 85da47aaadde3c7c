-- in_use.lua: how many live holds one ledger has, by the Redis clock.
--
-- KEYS[1]  ledger: the ledger
-- ARGV     none
--
-- Returns int: integer, the members whose expiry is still ahead. Read-only.
-- Errors  SLOTS_ARG 0 count: called with other keys or arguments

-- include: args
if #KEYS ~= 1 or #ARGV ~= 0 then return bad(0, 'count') end

local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
return redis.call('ZCOUNT', KEYS[1], '(' .. string.format('%.0f', now), '+inf')

-- release.lua: end one claim's holds.
--
-- KEYS[1..n]  the ledgers the claim holds
-- ARGV[1]     claim token
--
-- Returns the number of ledgers on which the token's own member was still a
-- live hold (expiry ahead of the Redis clock) when it was removed. Only that
-- member is ever touched: releasing twice, or after the hold expired, frees
-- no one else's hold and returns 0 (an expired member of the token is
-- deleted, but it held nothing, so it is not counted).

local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)

local removed = 0
for _, ledger in ipairs(KEYS) do
  local score = redis.call('ZSCORE', ledger, ARGV[1])
  if score then
    redis.call('ZREM', ledger, ARGV[1])
    if tonumber(score) > now then
      removed = removed + 1
    end
  end
end
return removed

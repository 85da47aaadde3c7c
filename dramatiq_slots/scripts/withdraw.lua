-- withdraw.lua: a claim stops waiting (its wait bound passed, or its worker
-- is stopping): it leaves every line it is in. A release may have handed it
-- a slot a moment before; that slot stays its own, and the caller decides.
--
-- KEYS[1..n]      the ledgers of the claim
-- KEYS[n+1..2n]   their lines
-- ARGV[1]         claim token
--
-- Returns how many of the ledgers the token holds now (n: it is admitted).

local n = #KEYS / 2
local held = 0
for i = 1, n do
  redis.call('ZREM', KEYS[n + i], ARGV[1])
  if redis.call('ZSCORE', KEYS[i], ARGV[1]) then
    held = held + 1
  end
end
return held

-- lib/outlive.lua: shared by the scripts that write a hold's expiry later than
-- the ones already in its ledger (inlined where a script says
-- "-- include: outlive", see Ledger's script loader).
--
-- outlive(key, at, ttl): make the ledger key expire no sooner than `at` (ms),
-- and never bring its expiry forward: a key lives as long as its longest
-- hold, so an abandoned ledger disappears by itself, and never sooner.
-- Redis >= 7 (and Valkey) do that in one command with PEXPIREAT ... GT; on
-- 6.2 the key's PTTL is read first (`ttl` is the hold ttl just written: a
-- shorter PTTL means `at` is later than the key's expiry).

local outlive_gt = (redis.REDIS_VERSION_NUM or 0) >= 0x070000
local function outlive(key, at, ttl)
  if outlive_gt then
    redis.call('PEXPIREAT', key, at, 'GT')
  elseif redis.call('PTTL', key) < ttl then
    redis.call('PEXPIREAT', key, at)
  end
end

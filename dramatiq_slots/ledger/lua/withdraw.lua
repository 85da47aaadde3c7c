-- withdraw.lua: a claim stops waiting (its wait bound passed, or its worker
-- is stopping): it leaves every line it is in. A release may have handed it
-- a slot a moment before; that slot stays its own, and the caller decides.
--
-- KEYS[1..n]      ledger: the ledgers of the claim
-- KEYS[n+1..2n]   line: their lines
-- KEYS[2n+1..3n]  fence: their fence keys (lib/fence.lua)
-- ARGV[1]         token (text): the claim token
-- ARGV[2]         ttl (integer >= 1): hold ttl, ms: how long a fence key lives
--
-- Returns Withdrawn: {held, f1, .., fn} how many of the ledgers the token holds
-- now (n: it is admitted), and then, only when it holds them all, a fresh fencing
-- token for each (the ones its handoffs carried may not have reached it).
-- Errors  SLOTS_ARG <j> <name>: ARGV[j] is malformed (j = 0: wrong count); nothing written

-- include: args
local n = #KEYS / 3
if n < 1 or n ~= math.floor(n) or #ARGV ~= 2 then return bad(0, 'count') end
local ttl = integer(ARGV[2], 1)
if not ttl then return bad(2, 'ttl') end
-- include: fence
local held = 0
for i = 1, n do
  redis.call('ZREM', KEYS[n + i], ARGV[1])
  if redis.call('ZSCORE', KEYS[i], ARGV[1]) then
    held = held + 1
  end
end
local reply = {held}
if held == n then
  for i = 1, n do reply[1 + i] = fence(KEYS[2 * n + i], ttl, nil) end
end
return reply

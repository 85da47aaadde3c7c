-- withdraw.lua: a claim stops waiting (its wait bound passed, or its worker
-- is stopping): it leaves every line it is in. A release may have handed it
-- a slot a moment before; that slot stays its own, and the caller decides.
--
-- KEYS[1..n]        ledger: the ledgers of the claim
-- KEYS[n+1..2n]     line: their lines
-- KEYS[2n+1..3n]    fence: their fence keys (lib/fence.lua)
-- KEYS[3n+1..4n]    shares: their groups' shares (hash, lib/turns.lua)
-- KEYS[4n+1..5n]    turns: their groups' turns (sorted set, lib/turns.lua)
-- ARGV[1]           token (text): the claim's member (lib/turns.lua)
-- ARGV[2]           ttl (integer >= 1): hold ttl, ms: how long a fence key lives
--
-- Returns Withdrawn: {held, f1, .., fn} how many of the ledgers the token holds
-- now (n: it is admitted), and then, only when it holds them all, a fresh fencing
-- token for each (the ones its handoffs carried may not have reached it).
-- Errors  SLOTS_ARG <j> <name>: ARGV[j] is malformed (j = 0: wrong count); nothing written

-- include: args
local n = #KEYS / 5
if n < 1 or n ~= math.floor(n) or #ARGV ~= 2 then return bad(0, 'count') end
local ttl = integer(ARGV[2], 1)
if not ttl then return bad(2, 'ttl') end
-- include: fence
-- include: outlive
-- include: turns
local held = 0
for i = 1, n do
  T.unjoin(T.ledger(KEYS[i], KEYS[n + i], KEYS[3 * n + i], KEYS[4 * n + i], 0, ttl), ARGV[1])
  if redis.call('ZSCORE', KEYS[i], ARGV[1]) then
    held = held + 1
  end
end
local reply = {held}
if held == n then
  for i = 1, n do reply[1 + i] = fence(KEYS[2 * n + i], ttl, nil) end
end
return reply

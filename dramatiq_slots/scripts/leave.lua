-- leave.lua: end one claim's holds, and hand each freed slot to the first
-- claim in that ledger's line (see enter.lua).
--
-- KEYS[1..n]      ledgers the claim holds
-- KEYS[n+1..2n]   their lines (sorted sets of claim tokens by place)
-- ARGV[1]         claim token
-- ARGV[2]         wake channel prefix: a waiter's channel is this prefix
--                 followed by its process part (the token without its last
--                 two ':' fields), see dramatiq_slots.wakeups
-- ARGV[2+i]       capacity of KEYS[i]
--
-- Per ledger where the token still has its member: removes it. Then, while
-- the ledger has room (fewer members than capacity; this also drains a
-- ledger over capacity after a re-assert or a lowered capacity) and a claim
-- is in line: pops the first, gives it a hold with the leaving member's
-- expiry (slot for slot: the new holder's heartbeat refreshes it within one
-- beat, and the key already outlives that expiry, so no TIME and no
-- PEXPIREAT here), and publishes "<token> <ledger>" on the waiter's process
-- wake channel. PUBLISH answers how many subscribers got it; 0 means that
-- process is gone (or not listening), so the hold is taken back and the
-- next claim in line is served.
--
-- A token without a member (its hold was lost, or released before) frees
-- nothing, so it hands nothing over.
--
-- Returns {removed, token, i, ...}: members removed, then for each slot
-- handed over the claim's token and the index i of KEYS[i] (at most one per
-- ledger), so a releaser can wake a claim of its own process at once.
-- A busy handoff costs 7 commands: EVALSHA, ZSCORE, ZREM, ZPOPMIN, ZCARD, ZADD, PUBLISH.

local n = #KEYS / 2
if n < 1 or n ~= math.floor(n) or #ARGV ~= n + 2 then
  return {-1, 0}
end
local token, channel = ARGV[1], ARGV[2]

local removed, handed = 0, {}
for i = 1, n do
  local ledger, waits, cap = KEYS[i], KEYS[n + i], tonumber(ARGV[2 + i])
  local expiry = redis.call('ZSCORE', ledger, token)
  if expiry then
    redis.call('ZREM', ledger, token)
    removed = removed + 1
    while true do
      local first = redis.call('ZPOPMIN', waits)
      local waiter, place = first[1], first[2]
      if not waiter then break end
      if redis.call('ZCARD', ledger) >= cap then
        redis.call('ZADD', waits, place, waiter)
        break
      end
      redis.call('ZADD', ledger, expiry, waiter)
      local process = string.match(waiter, '^(.*):[^:]*:[^:]*$') or waiter
      if redis.call('PUBLISH', channel .. process, waiter .. ' ' .. ledger) > 0 then
        handed[#handed + 1] = waiter
        handed[#handed + 1] = i
        break
      end
      redis.call('ZREM', ledger, waiter)
    end
  end
end
return {removed, unpack(handed)}

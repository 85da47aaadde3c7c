-- leave.lua: end one claim's holds, and hand each freed slot to the first
-- claim in that ledger's line (see enter.lua).
--
-- KEYS[1..n]        ledger: the ledgers the claim holds
-- KEYS[n+1..2n]     line: their lines (sorted sets of claim tokens by place)
-- KEYS[2n+1]        controls: the operators' controls (hash, lib/control.lua)
-- KEYS[2n+2..3n+1]  fence: their fence keys (lib/fence.lua): a handed slot gets
--                   the next fence
-- ARGV[1]           token (text): the claim token
-- ARGV[2]           channel (text): the wake channel prefix: a waiter's channel
--                   is this prefix followed by its process part (the token
--                   without its last two ':' fields), see dramatiq_slots.wakeups
-- ARGV[3]           ttl (integer >= 1): hold ttl, ms
-- ARGV[4]           age (integer >= -1): age of the leaving hold's expiry, ms:
--                   how long ago it was last written (the caller tracks it);
--                   -1 = unknown or too old, and the handed hold is then written
--                   afresh
-- ARGV[5]           own (text): the caller's own process part: a waiter of that
--                   same process is woken by the caller itself, so no PUBLISH
-- ARGV[6..n+5]      capacity (integer >= 0): declared capacity of KEYS[i]; 0 =
--                   unknown (an operator's release by hand): the slot is then
--                   handed on only when an override says the capacity, else to
--                   nobody
--
-- Controls: an override is the capacity; a paused ledger hands nothing on.
--
-- Per ledger where the token still has its member: while the ledger has room
-- without that member (fewer members than capacity; this also drains a
-- ledger over capacity after a re-assert or a lowered capacity) and a claim
-- is in line: pops the first, gives it a hold, and publishes
-- "<token> <expiry> <fence> <ledger>" on the waiter's process wake channel. The hold is
-- slot for slot: it keeps the leaving member's expiry, which the key already
-- outlives, so no TIME and no PEXPIREAT are needed, and <age> passes on how
-- old that expiry is. Handed on and on between short jobs, an expiry would
-- never be refreshed by any heartbeat; so when the caller says it is old
-- (ARGV[4] = -1: older than half the ttl, or unknown), the handed hold gets
-- now + ttl instead (TIME, and the key's expiry pushed out), and age 0.
-- PUBLISH answers how many subscribers got it; 0 means that process is gone
-- (or not listening), so the hold is taken back and the next claim in line
-- is served. Then the token's own member is removed.
--
-- A token without a member (its hold was lost, or released before) frees
-- nothing, so it hands nothing over.
--
-- Returns Left: {removed, token, i, age, fence, ...} members removed, then for each
-- slot handed over the claim's token, the index i of KEYS[i], the age passed on
-- and the claim's fencing token (at most one per ledger), so a releaser can wake
-- a claim of its own process at once. The wake-up message carries the fence too:
-- "<token> <expiry> <fence> <ledger>", <expiry> the handed hold's score (ms): a late
-- message still says how much of the hold is left.
-- Errors  SLOTS_ARG <j> <name>: ARGV[j] is malformed (j = 0: wrong count); nothing written
-- Costs: docs/design.md, "What each operation costs".

-- include: args
local n = (#KEYS - 1) / 3
if n < 1 or n ~= math.floor(n) or #ARGV ~= n + 5 then return bad(0, 'count') end
local token, channel, ttl, age, own = ARGV[1], ARGV[2], integer(ARGV[3], 1), integer(ARGV[4], -1), ARGV[5]
if not ttl then return bad(3, 'ttl') end
if not age then return bad(4, 'age') end
local caps = {}
for i = 1, n do
  caps[i] = integer(ARGV[5 + i], 0)
  if not caps[i] then return bad(5 + i, 'capacity') end
end

-- A renewed expiry is the ledger's newest: the key's expiry is pushed to it,
-- never earlier (lib/outlive.lua).
-- include: outlive
-- include: tell
-- include: control
-- include: fence
local controls = KEYS[2 * n + 1]
local renewed

local removed, handed = 0, {}
for i = 1, n do
  local ledger, line, cap, paused = KEYS[i], KEYS[n + i], nil, nil
  local expiry = redis.call('ZSCORE', ledger, token)
  if expiry then
    -- The waiter's hold is written before the leaving member is removed, so
    -- the key never empties on the way (an emptied key is deleted, and the
    -- new member would land in a key without an expiry).
    while true do
      local first = redis.call('ZPOPMIN', line)
      local waiter, place = first[1], first[2]
      if not waiter then break end
      -- The controls are read only when somebody waits: a release nobody waits
      -- for costs nothing more.
      if not cap then
        local c, p = control(controls, {ledger}, {caps[i]})
        cap, paused = c[1], p[1]
      end
      -- Room once the leaving member is gone: members - 1 < capacity.
      if cap == 0 or paused or redis.call('ZCARD', ledger) > cap then
        redis.call('ZADD', line, place, waiter)
        -- Popping the last claim deleted the line: the new key needs an expiry.
        if redis.call('PTTL', line) == -1 then redis.call('PEXPIRE', line, ttl) end
        break
      end
      local given, passed = expiry, age
      if age < 0 then
        if not renewed then
          local clock = redis.call('TIME')
          renewed = string.format('%.0f', tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000) + ttl)
        end
        given, passed = renewed, 0
      end
      redis.call('ZADD', ledger, given, waiter)
      local issued = fence(KEYS[2 * n + 1 + i], ttl, nil)
      if tell(channel, own, waiter, given, ledger, issued) then
        if age < 0 then outlive(ledger, renewed, ttl) end
        handed[#handed + 1] = waiter
        handed[#handed + 1] = i
        handed[#handed + 1] = passed
        handed[#handed + 1] = issued
        break
      end
      redis.call('ZREM', ledger, waiter)
    end
  end
  if expiry then
    redis.call('ZREM', ledger, token)
    removed = removed + 1
  end
end
return {removed, unpack(handed)}

-- leave.lua: end one claim's holds, and hand each freed slot to the first
-- claim in that ledger's line (see enter.lua).
--
-- KEYS[1..n]        ledger: the ledgers the claim holds
-- KEYS[n+1..2n]     line: their lines (sorted sets of claim tokens by place)
-- KEYS[2n+1]        controls: the operators' controls (hash, lib/control.lua)
-- KEYS[2n+2..3n+1]  fence: their fence keys (lib/fence.lua): a handed slot gets
--                   the next fence
-- KEYS[3n+2..4n+1]  shares: their groups' shares (hash, lib/turns.lua)
-- KEYS[4n+2..5n+1]  turns: their groups' turns (sorted set, lib/turns.lua)
-- ARGV[1]           token (text): the claim's member (lib/turns.lua)
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
-- Per ledger where the token still has its member: its group's shares are
-- counted down; then, while somebody waits, the room the ledger has without
-- the token's units (fewer units than capacity; this also drains a ledger over
-- capacity after a re-assert or a lowered capacity) goes to the claims in turn
-- (lib/turns.lua: each takes its need while the room fits it; a claim whose
-- need it does not fit keeps it, and nothing goes to the claims after it):
-- each is given a hold and told "<token> <expiry> <fence> <ledger>" on its
-- process's wake channel. The hold is slot for slot: it keeps the leaving
-- member's expiry, which the key already outlives, so no TIME and no PEXPIREAT
-- are needed, and <age> passes on how old that expiry is. Handed on and on
-- between short jobs, an expiry would never be refreshed by any heartbeat; so
-- when the caller says it is old (ARGV[4] = -1: older than half the ttl, or
-- unknown), the handed hold gets now + ttl instead (TIME, and the key's expiry
-- pushed out), and age 0. PUBLISH answers how many subscribers got it; 0 means
-- that process is gone (or not listening), so the hold is taken back and the
-- next claim in turn is served. Then the token's own units are removed.
--
-- A token without a member (its hold was lost, or released before) frees
-- nothing, so it hands nothing over.
--
-- Returns Left: {removed, token, i, age, fence, ...} members removed, then for each
-- slot handed over the claim's token, the index i of KEYS[i], the age passed on
-- and the claim's fencing token, so a releaser can wake a claim of its own
-- process at once. The wake-up message carries the fence too:
-- "<token> <expiry> <fence> <ledger>", <expiry> the handed hold's score (ms): a late
-- message still says how much of the hold is left.
-- Errors  SLOTS_ARG <j> <name>: ARGV[j] is malformed (j = 0: wrong count); nothing written
-- Costs: docs/design.md, "What each operation costs".

-- include: args
local n = (#KEYS - 1) / 5
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
-- include: turns
local controls = KEYS[2 * n + 1]
local renewed

local removed, handed = 0, {}
for i = 1, n do
  local L = T.ledger(KEYS[i], KEYS[n + i], KEYS[3 * n + 1 + i], KEYS[4 * n + 1 + i], 0, ttl)
  local expiry = redis.call('ZSCORE', L.ledger, token)
  if expiry then
    local names = T.names(token, T.units(token))
    local present = 1
    if #names > 1 then
      present = 0
      for _, score in ipairs(redis.call('ZMSCORE', L.ledger, unpack(names))) do
        if score then present = present + 1 end
      end
    end
    -- Its units count no more for its group; they stay members until the waiters' holds are
    -- written, so the key never empties on the way (an emptied key is deleted, and a new member
    -- would land in a key without an expiry).
    T.count(L, T.group(token), -present)
    L.leaving = present
    -- The controls are read only when somebody waits: a release nobody waits
    -- for costs nothing more.
    if T.waits(L) then
      local c, p = control(controls, {L.ledger}, {caps[i]})
      L.cap = c[1]
      T.rerank(L, T.group(token))
      -- Room once the leaving units are gone.
      local room = L.cap - (redis.call('ZCARD', L.ledger) - present)
      if L.cap > 0 and not p[1] and room > 0 then
        local passed = age
        T.hand_on(L, room, function()
          if age >= 0 then return expiry end
          if not renewed then
            local clock = redis.call('TIME')
            renewed = string.format('%.0f', tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000) + ttl)
          end
          passed = 0
          return renewed
        end, function()
          return fence(KEYS[2 * n + 1 + i], ttl, nil)
        end, function(waiter, at, issued)
          if not tell(channel, own, waiter, at, L.ledger, issued) then return false end
          if age < 0 then outlive(L.ledger, renewed, ttl) end
          handed[#handed + 1] = waiter
          handed[#handed + 1] = i
          handed[#handed + 1] = passed
          handed[#handed + 1] = issued
          return true
        end)
      end
    end
    redis.call('ZREM', L.ledger, unpack(names))
    removed = removed + 1
  end
end
return {removed, unpack(handed)}

-- enter.lua: admit one claim to every ledger it needs, or put it in line.
--
-- The waiting side of the FIFO handoff (leave.lua is the other side). A
-- claim refused by a full ledger may join that ledger's line; a release
-- then hands its freed slot straight to the first claim in line. The only
-- script that admits (Ledger.enter; ARGV[3] is its Line: NONE, JOIN, KEEP).
-- What each path costs: docs/design.md, "What each operation costs".
--
-- KEYS[1..n]        ledger: the claim's ledgers (sorted sets: member = claim token,
--                   score = expiry ms)
-- KEYS[n+1..2n]     line: their lines (sorted sets: member = claim token, score =
--                   its place, first in line = lowest)
-- KEYS[2n+1]        controls: the operators' controls (hash, lib/control.lua)
-- KEYS[2n+2..3n+1]  fence: their fence keys (lib/fence.lua)
-- KEYS[3n+2]        epoch: the epoch (lib/epoch.lua)
-- KEYS[3n+3..4n+2]  shares: their groups' shares (hash, lib/turns.lua)
-- KEYS[4n+3..5n+2]  turns: their groups' turns (sorted set, lib/turns.lua; a group's line
--                   is turns|<group>)
-- KEYS[5n+3..6n+2]  backlog: the backlogs the message is listed on (backlog.lua), one per
--                   ledger
-- ARGV[1]           token (text, not empty): the claim's member (lib/turns.lua: its
--                   token, units and group)
-- ARGV[2]           ttl (integer >= 1): hold ttl, ms
-- ARGV[3]           line (0, 1 or 2): 0 = do not wait; 1 = join the refusing
--                   ledger's line; 2 = already in line (a waiter asking again:
--                   keeps its place, or takes it again if a release dropped it)
-- ARGV[4]           place (number): score in line, an integer below 2^53 in
--                   magnitude, lowest first; the middleware passes its priority
--                   class, then when the message was first sent, in us (so a line
--                   is served in the order of priority, then of sending, whatever
--                   the order in which workers took its messages; ties: by token).
--                   Written as given, never through a Lua number.
-- ARGV[5..n+4]      capacity (integer >= 1): declared capacity of KEYS[i]; an
--                   operator's override wins over it
-- ARGV[n+5..2n+4]   busy (0, 1 or 2): what a full KEYS[i] does with the claim
--                   (on_busy): 0 = wait (as ARGV[3] says); 1 = drop it (skip);
--                   2 = drop it when a claim waits in that line already (coalesce;
--                   a claim in line itself, ARGV[3] = 2, is never dropped). A
--                   paused ledger never drops: its claims wait
-- ARGV[2n+5]        settle (integer >= 0): settling time, ms: how long no newcomer
--                   is admitted after the epoch is found lost (lib/epoch.lua);
--                   0 = the epoch is neither read nor made
-- ARGV[2n+6]        known (integer >= 0): the born of the epoch the caller last
--                   saw (lib/epoch.lua); 0 = it saw none
-- ARGV[2n+7..3n+6]  waiting (integer >= 0): the most claims that may wait in
--                   KEYS[i]'s line (the line of the claim's group, when it has
--                   one); 0 = no bound
-- ARGV[3n+7]        listed (text): the message's id on its backlogs, taken off when
--                   it is admitted or dropped; '' = on none
-- ARGV[3n+8]        channel (text): the operators' controls channel (the prefix's,
--                   whatever the home), where a line that forms is told
--
-- Returns Entered: {1, replay, m1, .., mn, c1, .., cn, f1, .., fn}
--                       admitted; replay = 1 when the token already held every
--                       ledger (a retried call, or a slot a release handed over);
--                       mi = units in use on KEYS[i] now (its capacity when the
--                       token already held it: no count was taken); ci = the
--                       capacity in force on KEYS[i]; fi = its fencing token for
--                       this admission (a replay gets a fresh one too)
--      or {0, i, w, p, d, s, o} refused at KEYS[i], the first full (or paused) ledger;
--                       w = 1 when the claim is in that ledger's line now; p = 1
--                       when that ledger is paused; d = 1 when the claim is
--                       dropped by its on_busy policy (then w = 0); s = the ms
--                       left of a settling that refused it (then i is the first
--                       ledger it did not hold; 0: not settling); o = 1 when it
--                       did not join the line because ARGV[2n+6+i] claims wait
--                       there already (then w = 0)
-- Errors  SLOTS_ARG <j> <name>: ARGV[j] is malformed (j = 0: wrong count); nothing written
--
-- Counting: a ledger is full for a claim when its members (ZCARD: units) and
-- the claim's need (lib/turns.lua) pass its capacity. That counts expired
-- members of dead holders until someone sweeps them (every heartbeat of a
-- process holding the ledger does, and a key whose holders all died expires
-- as a whole), so a refusal may be late by one beat, never an admission
-- early. This keeps the refusal path, the busy one while claims wait, free
-- of TIME and of a sweep.
--
-- Turns: a ledger with room admits a claim only when no claim waits before it
-- (lib/turns.lua, T.admits: the first in turn asking again is admitted; a
-- newcomer joins the line behind the waiters, and a claim whose need the room
-- does not fit yet keeps the room) and its group stays within its maximum share.
--
-- Controls: a paused ledger refuses every claim it does not hold already (it
-- may join the line, and keeps its place there); an override is the capacity.
--
-- Settling (lib/epoch.lua): while the epoch says the ledgers may have lost the
-- holds of running jobs, a claim that would be admitted is refused as by a
-- paused ledger (it may wait in line, and is never dropped), so a ledger that
-- restarted empty admits nothing over its capacity while those jobs' heartbeats
-- re-assert their holds. Read only on the admission path (a refusal costs
-- nothing more), with the TIME that path reads anyway.
--
-- All or nothing: a claim refused on any ledger holds none of them; a slot
-- it was handed on another ledger is given back (to whoever asks next).
--
-- A line forms: a claim that joins (line 1) the line of a ledger of capacity 4 or more
-- where no claim waited (neither its line nor its turns existed) PUBLISHes 'line <ledger>'
-- on the channel (a ledger's name begins with '{'), so that every worker process gives
-- back the slots it keeps there between jobs (worker/lingering.py; a ledger of capacity
-- below 4 never has one). A claim joining a line that was there already, or asking again
-- (line 2), publishes nothing.
--
-- Lines expire: a claim that joins a line (or takes its place again) makes
-- that line's key live at least ttl / 2 more (PTTL, then PEXPIRE to ttl when
-- less is left: relative, so still no TIME on the refusal path); the beats of
-- live waiters' processes push it on. A line whose waiters all died is gone
-- within ttl of its last push.

-- include: args
local n = (#KEYS - 2) / 6
if n < 1 or n ~= math.floor(n) or #ARGV ~= 3 * n + 8 then return bad(0, 'count') end
local listed, channel = ARGV[3 * n + 7], ARGV[3 * n + 8]
local token, ttl, line, place = ARGV[1], integer(ARGV[2], 1), tonumber(ARGV[3]), tonumber(ARGV[4])
if token == '' then return bad(1, 'token') end
if not ttl then return bad(2, 'ttl') end
if line ~= 0 and line ~= 1 and line ~= 2 then return bad(3, 'line') end
if not place then return bad(4, 'place') end
local settle, known = integer(ARGV[2 * n + 5], 0), integer(ARGV[2 * n + 6], 0)
if not settle then return bad(2 * n + 5, 'settle') end
if not known then return bad(2 * n + 6, 'known') end
-- include: control
-- include: outlive
-- include: turns
local controls = KEYS[2 * n + 1]
local caps, paused = {}, nil
local busy, most = {}, {}
for i = 1, n do
  caps[i] = integer(ARGV[4 + i], 1)
  if not caps[i] then return bad(4 + i, 'capacity') end
  busy[i] = tonumber(ARGV[4 + n + i])
  if busy[i] ~= 0 and busy[i] ~= 1 and busy[i] ~= 2 then return bad(4 + n + i, 'busy') end
  most[i] = integer(ARGV[2 * n + 6 + i], 0)
  if not most[i] then return bad(2 * n + 6 + i, 'waiting') end
end
local ledgers = {}
for i = 1, n do ledgers[i] = KEYS[i] end
caps, paused = control(controls, ledgers, caps)
local L = {}
for i = 1, n do L[i] = T.ledger(KEYS[i], KEYS[n + i], KEYS[3 * n + 2 + i], KEYS[4 * n + 2 + i], caps[i], ttl) end

-- A first call (line 1) skips the replay check: its token is fresh, and if
-- redis-py resent it after a lost reply that had admitted it, the claim
-- queues up while holding its slot and finds that out when it asks again
-- (line 2), a few seconds later. That case is rare; the check is not free.
local held, members, need, replay, refused, new, behind = {}, {}, {}, 1, 0, 0, false
for i = 1, n do
  if line ~= 1 then held[i] = redis.call('ZSCORE', KEYS[i], token) end
  if not held[i] then
    if new == 0 then new = i end
    members[i] = redis.call('ZCARD', KEYS[i])
    need[i] = T.need(L[i], token)
    if refused == 0 then
      if paused[i] or members[i] + need[i] > caps[i] then
        refused = i
      elseif not T.admits(L[i], token, need[i], caps[i] - members[i]) then
        refused, behind = i, true  -- room, but a claim waits before it
      end
    end
  end
end

-- include: epoch
local clock, now_ms, unsettled = nil, nil, 0
if refused == 0 or (behind and settle > 0) then
  clock = redis.call('TIME')
  now_ms = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
  if new > 0 and settle > 0 then
    -- A claim behind others while the ledgers settle is refused by the settling too (never dropped).
    unsettled = settling(KEYS[3 * n + 2], now_ms, settle, known, controls)
    if unsettled > 0 and refused == 0 then refused = new end
  end
end

if refused > 0 then
  for i = 1, n do
    if held[i] then
      T.drop(L[i], token)
      T.rerank(L[i], T.group(token))
    end
  end
  local R = L[refused]
  -- on_busy: a full (not paused, not settling) ledger drops the claim instead of letting it wait.
  if not paused[refused] and unsettled == 0 and (busy[refused] == 1 or
      (busy[refused] == 2 and line ~= 2 and T.waits(R))) then
    if listed ~= '' then
      for i = 1, n do redis.call('ZREM', KEYS[5 * n + 2 + i], listed) end
    end
    return {0, refused, 0, 0, 1, 0, 0}
  end
  if line > 0 then
    -- A bounded line (max_waiting) takes no claim past its bound; a claim in it already keeps its place.
    if most[refused] > 0 and (line == 1 or not redis.call('ZSCORE', T.line_of(R, T.group(token)), token))
        and T.waiting(R, token) >= most[refused] then
      return {0, refused, 0, paused[refused] and 1 or 0, 0, unsettled, 1}
    end
    local formed = false
    if line == 1 and caps[refused] >= 4 then
      -- Neither key: nobody waits, and T.join need not ask for turns; both: turns. (Not T.waits:
      -- with one of the two it makes T.join read the line's head.)
      local found = redis.call('EXISTS', R.line, R.turns)
      if found ~= 1 then R.grouped, formed = found == 2, found == 0 end
    end
    T.join(R, token, ARGV[4])
    if formed then redis.call('PUBLISH', channel, 'line ' .. KEYS[refused]) end
  end
  return {0, refused, line > 0 and 1 or 0, paused[refused] and 1 or 0, 0, unsettled, 0}
end

local expiry = string.format('%.0f', now_ms + ttl)
local now_us = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
-- include: fence

-- The key must outlive its longest hold: a new key expires with its first
-- hold; an existing one is only ever pushed later (lib/outlive.lua).

local after = {}
for i = 1, n do
  -- replay: every ZADD found the token already there.
  local added = T.write(L[i], token, need[i] or T.need(L[i], token), expiry)
  if added > 0 then replay = 0 end
  -- A claim re-asserted with more units than it needs keeps them all refreshed.
  if held[i] and T.units(token) > T.need(L[i], token) then T.write(L[i], token, T.units(token), expiry, 'XX') end
  after[i] = members[i] and members[i] + added or caps[i]
  if members[i] == 0 then
    redis.call('PEXPIREAT', KEYS[i], expiry)
  else
    outlive(KEYS[i], expiry, ttl)
  end
  if line == 2 then T.unjoin(L[i], token) end
  if added > 0 then
    T.served(L[i], T.group(token))
    T.rerank(L[i], T.group(token))
  end
end
if listed ~= '' then
  for i = 1, n do redis.call('ZREM', KEYS[5 * n + 2 + i], listed) end
end
local reply = {1, replay}
for i = 1, n do reply[2 + i] = after[i] end
for i = 1, n do reply[2 + n + i] = caps[i] end
for i = 1, n do reply[2 + 2 * n + i] = fence(KEYS[2 * n + 1 + i], ttl, now_us) end
return reply

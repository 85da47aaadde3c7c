-- beat.lua: one heartbeat of one process, in one round trip: refresh every
-- hold it has, retry the releases it owes, keep alive the lines its claims
-- wait in, and hand the slots that expired in those lines' ledgers to the
-- first claims in line.
--
-- KEYS[1..4r]  (refreshed, refreshed_line, refreshed_shares, refreshed_turns): the
--               holds to refresh, four keys each: the ledger, its line, its groups'
--               shares and turns (lib/turns.lua)
-- KEYS[4r+1..4r+4o]  (owed, owed_line, owed_shares, owed_turns): the owed releases,
--               four keys each: the ledger, its line, its groups' shares and turns
-- KEYS[4r+4o+1..4r+4o+5w]  (waited, waited_line, waited_fence, waited_shares, waited_turns):
--               the lines that claims of this process wait in, five keys each: the
--               ledger, its line, its fence key, its groups' shares and turns
-- KEYS[4r+4o+5w+1]           epoch: the epoch (lib/epoch.lua)
-- KEYS[4r+4o+5w+2]           controls: the operators' controls (hash, lib/control.lua)
-- ARGV[1]                    ttl (integer >= 1): hold ttl, ms
-- ARGV[2]                    r (integer >= 0): how many holds to refresh
-- ARGV[3]                    o (integer >= 0): how many owed releases (w, the
--                            waited lines, is what KEYS has left for them)
-- ARGV[4..r+3]               refresh_token (text): the claim's member of refresh i
-- ARGV[r+4..r+o+3]           owed_token (text): the claim's member of owed release j
-- ARGV[r+o+4]                channel (text): the wake channel prefix (as
--                            leave.lua's ARGV[2])
-- ARGV[r+o+5]                own (text): the caller's own process part (as
--                            leave.lua's ARGV[5])
-- ARGV[r+o+6]                settle (integer >= 0): settling time, ms (as
--                            enter.lua's): while the epoch says the ledgers are
--                            settling (a missing epoch is made), nothing is handed
--                            on from a line; 0 = the epoch is not read
-- ARGV[r+o+7]                known (integer >= 0): the born of the epoch the caller
--                            last saw (as enter.lua's)
-- ARGV[r+o+8..r+o+w+7]       capacity (integer >= 1): declared capacity of the k-th
--                            waited ledger; an override wins, and a paused ledger
--                            hands nothing on
-- ARGV[r+o+w+8..r+o+2w+7]    groups (text): the groups (lib/turns.lua), space
--                            separated, whose lines on the k-th waited ledger claims
--                            of this process wait in ('': none)
--
-- Returns Beaten: {lost, handed, bad, now} lost lists the indexes i (1 <= i <= r) whose hold
-- was lost: the member was gone (Redis lost it) or had already expired (the
-- holder was silent longer than the ttl). A lost hold is NOT re-created here:
-- a refresh only extends members that exist (ZADD XX), so a beat racing a
-- release can never resurrect the released hold. The caller decides, under
-- its own lock, whether to re-assert (reassert.lua). handed lists, for each
-- slot handed to a claim of the caller's own process, its token, k and the
-- fencing token it was given (lib/fence.lua; told to other processes in the
-- wake-up message). bad lists, for each ledger whose keys Redis refused (a key
-- of another type, set by mistake), the ledger and the error, in turn: its
-- holds are neither refreshed nor reported lost, nothing is handed on there,
-- and every other ledger of the beat is served as usual (one bad key must not
-- cost a process the refresh of its other holds). A key the caller may not
-- touch (ACL) fails the whole call before it runs; the heartbeat then beats
-- each ledger on its own to find it. now is the Redis clock (ms) the beat read:
-- how a process reads the expiry a wake-up message carries.
-- Errors  SLOTS_ARG <j> <name>: ARGV[j] is malformed (j = 0: wrong count: of KEYS for
--         r and o, or of ARGV); nothing written
--
-- Each refreshed or waited ledger is swept of expired members (holders that
-- died), their groups' shares with them, and those groups ranked again:
-- admission (enter.lua) counts members, not live holds, so the beats of the
-- live holders and waiters are what return a dead holder's slot. A refresh
-- writes every unit member of the hold (ZADD XX). A waited ledger with room
-- after its sweep hands it on as a release does (leave.lua, lib/turns.lua),
-- with a fresh expiry: a slot freed by expiry is in use again within one beat
-- of its expiry, not at a waiter's next ask.
--
-- An owed release takes the claim's units out of the ledger and the claim out
-- of its line (a claim an exception took out of its admission may be in
-- either); the caller lists its ledgers among the waited ones too, so the room
-- it frees is handed on in the same beat, as a release hands it. A waited line, its ledger's turns and shares and the lines of the
-- groups this process waits in get an expiry of at least now + ttl (a line
-- nobody refreshes expires: enter.lua gives each new line one).

-- include: args
if #ARGV < 7 then return bad(0, 'count') end
local ttl, r, o = integer(ARGV[1], 1), integer(ARGV[2], 0), integer(ARGV[3], 0)
if not ttl then return bad(1, 'ttl') end
if not r then return bad(2, 'r') end
if not o then return bad(3, 'o') end
local w = (#KEYS - 2 - 4 * r - 4 * o) / 5
if w < 0 or w ~= math.floor(w) or #ARGV ~= 7 + r + o + 2 * w then return bad(0, 'count') end
local channel, own, settle = ARGV[4 + r + o], ARGV[5 + r + o], integer(ARGV[6 + r + o], 0)
local known = integer(ARGV[7 + r + o], 0)
if not settle then return bad(6 + r + o, 'settle') end
if not known then return bad(7 + r + o, 'known') end
local caps = {}
for k = 1, w do
  caps[k] = integer(ARGV[7 + r + o + k], 1)
  if not caps[k] then return bad(7 + r + o + k, 'capacity') end
end

local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local expiry = string.format('%.0f', now + ttl)

-- include: outlive
-- include: tell
-- include: control
-- include: fence
-- include: epoch
-- include: turns

-- The first command on each ledger is a pcall: a ledger whose key Redis refuses
-- goes to `bad` and is skipped from then on (what follows on a key that
-- answered it is a sorted set's command on a sorted set, or on nothing).
local lost, swept, bad, refused = {}, {}, {}, {}
local function refused_by(ledger, err)
  bad[#bad + 1] = ledger
  bad[#bad + 1] = type(err) == 'table' and err.err or tostring(err)
  refused[ledger] = true
end

-- The ledger's expired members out, and the groups whose holds changed ranked again.
local function sweep(L)
  if swept[L.ledger] == nil then
    local read, per = pcall(T.sweep, L, now)
    swept[L.ledger] = read
    if not read then
      refused_by(L.ledger, per)
    elseif per then
      for group in pairs(per) do T.rerank(L, group) end
    end
  end
  return swept[L.ledger]
end

for i = 1, r do
  local b = 4 * (i - 1)
  local L = T.ledger(KEYS[b + 1], KEYS[b + 2], KEYS[b + 3], KEYS[b + 4], 0, ttl)
  local token = ARGV[3 + i]
  local score = sweep(L) and redis.call('ZSCORE', L.ledger, token)
  if refused[L.ledger] then
    -- neither refreshed nor lost: the caller reports the ledger
  elseif score and tonumber(score) > now then
    T.write(L, token, T.units(token), expiry, 'XX')
    local last = redis.call('ZRANGE', L.ledger, -1, -1, 'WITHSCORES')
    redis.call('PEXPIREAT', L.ledger, last[2])
    if T.group(token) ~= '' then outlive(L.shares, expiry, ttl) end
  else
    if score then
      T.drop(L, token)
      T.rerank(L, T.group(token))
    end
    lost[#lost + 1] = i
  end
end

-- pcall: a key that is not a sorted set (an operator's mistake, or a permanent error that
-- failed the admission owing this release) holds no member of ours, and must not fail the
-- beat that refreshes every other hold of the process.
for j = 1, o do
  local b = 4 * r + 4 * (j - 1)
  local L = T.ledger(KEYS[b + 1], KEYS[b + 2], KEYS[b + 3], KEYS[b + 4], 0, ttl)
  local token = ARGV[3 + r + j]
  pcall(function()
    if T.drop(L, token) > 0 then T.rerank(L, T.group(token)) end
  end)
  pcall(T.unjoin, L, token)
end

-- The epoch and the controls are the prefix's own keys, not a ledger's: one Redis
-- refuses (another type) hands nothing on anywhere, and is reported as a bad ledger
-- by its key's name; the refreshes above stand.
local unsettled = false
if w > 0 and settle > 0 then
  local read, left = pcall(settling, KEYS[#KEYS - 1], now, settle, known, KEYS[#KEYS])
  if not read then refused_by(KEYS[#KEYS - 1], left) end
  unsettled = not read or left > 0
end
local now_us = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local handed = {}
for k = 1, w do
  local b = 4 * r + 4 * o + 5 * (k - 1)
  local fences = KEYS[b + 3]
  local L = T.ledger(KEYS[b + 1], KEYS[b + 2], KEYS[b + 4], KEYS[b + 5], 0, ttl)
  local cap, paused = 0, true
  if not refused[KEYS[#KEYS]] then
    local read, c, p = pcall(control, KEYS[#KEYS], {L.ledger}, {caps[k]}, now)
    if read then
      cap, paused = c[1], p[1] or unsettled
    else
      refused_by(KEYS[#KEYS], c)
    end
  end
  L.cap = cap
  if sweep(L) and not paused then
    -- A line, a group's key or a fence key Redis refuses makes its ledger bad too; a fence is
    -- taken before the waiter's hold is written, so no hold is given untold.
    local gave = false
    local served, err = pcall(T.hand_on, L, cap - redis.call('ZCARD', L.ledger), function()
      return expiry
    end, function()
      return fence(fences, ttl, now_us)
    end, function(waiter, at, issued)
      local told = tell(channel, own, waiter, at, L.ledger, issued)
      if told == 'own' then
        handed[#handed + 1] = waiter
        handed[#handed + 1] = k
        handed[#handed + 1] = issued
      end
      gave = gave or told ~= false
      return told
    end)
    if not served then refused_by(L.ledger, err) end
    -- A new (or emptied, so deleted) key expires with its first hold; an existing one is pushed.
    if gave then
      if redis.call('PTTL', L.ledger) == -1 then
        redis.call('PEXPIREAT', L.ledger, expiry)
      else
        outlive(L.ledger, expiry, ttl)
      end
    end
  end
  -- Never brought forward, and given to a line without one (-1; -2: no line).
  local kept = {L.line, L.turns, L.shares}
  for group in string.gmatch(ARGV[7 + r + o + w + k], '%x+') do kept[#kept + 1] = T.line_of(L, group) end
  for _, key in ipairs(kept) do
    local left = redis.pcall('PTTL', key)
    if type(left) == 'number' and (left == -1 or (left >= 0 and left < ttl)) then
      redis.call('PEXPIREAT', key, expiry)
    end
  end
end

return {lost, handed, bad, string.format('%.0f', now)}

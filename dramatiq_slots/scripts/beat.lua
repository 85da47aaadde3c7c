-- beat.lua: one heartbeat of one process, in one round trip: refresh every
-- hold it has, retry the releases it owes, keep alive the lines its claims
-- wait in, and hand the slots that expired in those lines' ledgers to the
-- first claims in line.
--
-- KEYS[1..r]         ledgers of the holds to refresh
-- KEYS[r+1..r+2o]    owed releases, two keys each: the ledger, then its line
-- KEYS[r+2o+1..n-1]  lines that claims of this process wait in, three keys
--                    each: the ledger, its line, its fence key (w triples)
-- KEYS[n]            the operators' controls (hash, lib/control.lua)
-- ARGV[1]            hold ttl in milliseconds (integer >= 1)
-- ARGV[2]            r, how many holds to refresh (0 <= r)
-- ARGV[3]            o, how many owed releases (0 <= o, r + 2o <= n)
-- ARGV[3+i]          claim token of refresh i (1 <= i <= r), then of owed release j
--                    at ARGV[3+r+j] (1 <= j <= o)
-- ARGV[4+r+o]        wake channel prefix (as leave.lua's ARGV[2])
-- ARGV[5+r+o]        the caller's own process part (as leave.lua's ARGV[5])
-- ARGV[5+r+o+k]      declared capacity of the k-th waited ledger (integer >= 1);
--                    an override wins, and a paused ledger hands nothing on
--
-- Returns {lost, handed}: lost lists the indexes i (1 <= i <= r) whose hold
-- was lost: the member was gone (Redis lost it) or had already expired (the
-- holder was silent longer than the ttl). A lost hold is NOT re-created here:
-- a refresh only extends members that exist (ZADD XX), so a beat racing a
-- release can never resurrect the released hold. The caller decides, under
-- its own lock, whether to re-assert (reassert.lua). handed lists, for each
-- slot handed to a claim of the caller's own process, its token, k and the
-- fencing token it was given (lib/fence.lua; told to other processes in the
-- wake-up message).
-- Returns {-1, j} when ARGV[j] is malformed (j = 0: wrong count); nothing written.
--
-- Each refreshed or waited ledger is swept of expired members (holders that
-- died): admission (enter.lua) counts members, not live holds, so the beats
-- of the live holders and waiters are what return a dead holder's slot.
-- A waited ledger with room after its sweep hands it on as a release does
-- (leave.lua), with a fresh expiry: a slot freed by expiry is in use again
-- within one beat of its expiry, not at a waiter's next ask.
--
-- An owed release is a plain ZREM of the token from the ledger and from its
-- line (a claim an exception took out of its admission may be in either):
-- no handoff here; the next waiter's beat (or its own ask) finds the room.
-- A waited line gets an expiry of at least now + ttl (a line nobody
-- refreshes expires: enter.lua gives each new line one).

local ttl, r, o = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
if not ttl or ttl < 1 or ttl ~= math.floor(ttl) then
  return {-1, 1}
end
if not r or r < 0 or r ~= math.floor(r) then
  return {-1, 2}
end
local w = (#KEYS - 1 - r - 2 * (o or 0)) / 3
if not o or o < 0 or o ~= math.floor(o) or w < 0 or w ~= math.floor(w) or #ARGV ~= 5 + r + o + w then
  return {-1, 3}
end
local channel, own = ARGV[4 + r + o], ARGV[5 + r + o]
local caps = {}
for k = 1, w do
  caps[k] = tonumber(ARGV[5 + r + o + k])
  if not caps[k] or caps[k] < 1 or caps[k] ~= math.floor(caps[k]) then return {-1, 5 + r + o + k} end
end

local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local expiry = string.format('%.0f', now + ttl)

local lost, swept = {}, {}
for i = 1, r do
  local ledger, token = KEYS[i], ARGV[3 + i]
  if not swept[ledger] then
    swept[ledger] = true
    redis.call('ZREMRANGEBYSCORE', ledger, '-inf', now)
  end
  local score = redis.call('ZSCORE', ledger, token)
  if score and tonumber(score) > now then
    redis.call('ZADD', ledger, 'XX', expiry, token)
    local last = redis.call('ZRANGE', ledger, -1, -1, 'WITHSCORES')
    redis.call('PEXPIREAT', ledger, last[2])
  else
    if score then
      redis.call('ZREM', ledger, token)
    end
    lost[#lost + 1] = i
  end
end

-- pcall: a key that is not a sorted set (an operator's mistake, or a permanent error that
-- failed the admission owing this release) holds no member of ours, and must not fail the
-- beat that refreshes every other hold of the process.
for j = 1, o do
  local token = ARGV[3 + r + j]
  redis.pcall('ZREM', KEYS[r + 2 * j - 1], token)
  redis.pcall('ZREM', KEYS[r + 2 * j], token)
end

-- include: outlive
-- include: tell
-- include: control
-- include: fence

local handed = {}
for k = 1, w do
  local base = r + 2 * o + 3 * (k - 1)
  local ledger, line, fences = KEYS[base + 1], KEYS[base + 2], KEYS[base + 3]
  if not swept[ledger] then
    swept[ledger] = true
    redis.call('ZREMRANGEBYSCORE', ledger, '-inf', now)
  end
  local c, p = control(KEYS[#KEYS], {ledger}, {caps[k]})
  local cap, paused = c[1], p[1]
  while not paused do
    local members = redis.call('ZCARD', ledger)
    if members >= cap then break end
    local first = redis.call('ZPOPMIN', line)
    local waiter = first[1]
    if not waiter then break end
    redis.call('ZADD', ledger, expiry, waiter)
    -- A new (or emptied, so deleted) key expires with its first hold.
    if members == 0 then redis.call('PEXPIREAT', ledger, expiry) end
    local issued = fence(fences, ttl, tonumber(clock[1]) * 1000000 + tonumber(clock[2]))
    local told = tell(channel, own, waiter, 0, ledger, issued)
    if told == 'own' then
      handed[#handed + 1] = waiter
      handed[#handed + 1] = k
      handed[#handed + 1] = issued
    end
    if not told then
      redis.call('ZREM', ledger, waiter)  -- nobody listens: the next in line is served
    elseif members > 0 then
      outlive(ledger, expiry, ttl)
    end
  end
  -- Never brought forward, and given to a line without one (-1; -2: no line).
  local left = redis.call('PTTL', line)
  if left == -1 or (left >= 0 and left < ttl) then
    redis.call('PEXPIREAT', line, expiry)
  end
end

return {lost, handed}

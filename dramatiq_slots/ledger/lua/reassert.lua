-- reassert.lua: put back holds that were lost while their jobs still run.
--
-- Used by the heartbeat after beat.lua reported a hold lost (Redis restarted
-- without persistence, or the process was paused longer than the ttl). The
-- job is running whatever the ledger says, so its hold is re-added even when
-- that puts the ledger over capacity: the ledger must count what really
-- runs, and new admissions then wait until it drains.
--
-- KEYS[1..n]        ledger: the ledgers of the lost holds
-- KEYS[n+1..2n]     line: their lines
-- KEYS[2n+1..3n]    shares: their groups' shares (hash, lib/turns.lua)
-- KEYS[3n+1..4n]    turns: their groups' turns (sorted set, lib/turns.lua)
-- ARGV[1]           ttl (integer >= 1): hold ttl, ms
-- ARGV[2..n+1]      token (text): the claim's member of the hold on KEYS[i]
--
-- Returns list[int]: {live1, .., liven} livei = how many live units the ledger
-- of KEYS[i] has afterwards.
-- Errors  SLOTS_ARG <j> <name>: ARGV[j] is malformed (j = 0: wrong count); nothing written
--
-- A hold of several units is put back with all of them (lib/turns.lua), and
-- its group's shares count them again.

-- include: args
local n = #KEYS / 4
if n < 1 or n ~= math.floor(n) or #ARGV ~= n + 1 then return bad(0, 'count') end
local ttl = integer(ARGV[1], 1)
if not ttl then return bad(1, 'ttl') end
-- include: outlive
-- include: turns

local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local expiry = string.format('%.0f', now + ttl)

local counts = {}
for i = 1, n do
  local L = T.ledger(KEYS[i], KEYS[n + i], KEYS[2 * n + i], KEYS[3 * n + i], 0, ttl)
  local token = ARGV[1 + i]
  local changed = T.sweep(L, now) or {}
  T.write(L, token, T.units(token), expiry)
  changed[T.group(token)] = true
  local last = redis.call('ZRANGE', L.ledger, -1, -1, 'WITHSCORES')
  redis.call('PEXPIREAT', L.ledger, last[2])
  for group in pairs(changed) do T.rerank(L, group) end
  counts[i] = redis.call('ZCARD', L.ledger)
end
return counts

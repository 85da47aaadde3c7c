-- reclaim.lua: take a lost hold back only where it still fits (the strict
-- counterpart of reassert.lua, for on_lost_hold="interrupt").
--
-- Used by the heartbeat after beat.lua reported a hold of a strict claim
-- lost. The claim's job is still running; if every ledger it held has room
-- for it (or still lists it), it is held again and goes on. If any ledger is
-- full without it, somebody else was admitted meanwhile: nothing is written,
-- and the caller interrupts the job instead, so the cap is never exceeded.
--
-- KEYS[1..n]        ledger: the claim's ledgers
-- KEYS[n+1]         controls: the operators' controls (hash, lib/control.lua)
-- KEYS[n+2..2n+1]   line: their lines
-- KEYS[2n+2..3n+1]  shares: their groups' shares (hash, lib/turns.lua)
-- KEYS[3n+2..4n+1]  turns: their groups' turns (sorted set, lib/turns.lua)
-- ARGV[1]           token (text, not empty): the claim's member (lib/turns.lua)
-- ARGV[2]           ttl (integer >= 1): hold ttl, ms
-- ARGV[3..n+2]      capacity (integer >= 1): declared capacity of KEYS[i]; an
--                   override wins. A pause does not count: the claim's job is
--                   running already
--
-- Returns Reclaimed: {1, 0} held again on every ledger (a fresh expiry on each)
--      or {0, i} KEYS[i] is full without this claim: nothing written
-- Errors  SLOTS_ARG <j> <name>: ARGV[j] is malformed (j = 0: wrong count); nothing written
--
-- Expired members are swept first (by TIME), so a dead holder's leftovers
-- do not count against the claim. This runs only after a loss, so the sweep
-- costs nothing on the busy path. A slot handed to a waiter is a member and
-- counts: it belongs to the waiter. A claim of several units needs room for
-- its need (lib/turns.lua) where it holds none of them.

-- include: args
local n = (#KEYS - 1) / 4
if n < 1 or n ~= math.floor(n) or #ARGV ~= n + 2 then return bad(0, 'count') end
local token, ttl = ARGV[1], integer(ARGV[2], 1)
if token == '' then return bad(1, 'token') end
if not ttl then return bad(2, 'ttl') end
local caps = {}
for i = 1, n do
  caps[i] = integer(ARGV[2 + i], 1)
  if not caps[i] then return bad(2 + i, 'capacity') end
end

-- include: outlive
-- include: control
-- include: turns

local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)

local ledgers = {}
for i = 1, n do ledgers[i] = KEYS[i] end
caps = control(KEYS[n + 1], ledgers, caps, now)
local L, members, changed = {}, {}, {}
for i = 1, n do
  L[i] = T.ledger(KEYS[i], KEYS[n + 1 + i], KEYS[2 * n + 1 + i], KEYS[3 * n + 1 + i], caps[i], ttl)
  changed[i] = T.sweep(L[i], now) or {}
  members[i] = redis.call('ZCARD', KEYS[i])
  if members[i] + T.need(L[i], token) > caps[i] and not redis.call('ZSCORE', KEYS[i], token) then
    for group in pairs(changed[i]) do T.rerank(L[i], group) end
    return {0, i}
  end
end

local expiry = string.format('%.0f', now + ttl)
for i = 1, n do
  T.write(L[i], token, T.need(L[i], token), expiry)
  changed[i][T.group(token)] = true
  if members[i] == 0 then
    redis.call('PEXPIREAT', KEYS[i], expiry)  -- a new key: nothing to outlive
  else
    outlive(KEYS[i], expiry, ttl)
  end
  for group in pairs(changed[i]) do T.rerank(L[i], group) end
end
return {1, 0}

-- acquire.lua: take one hold on every ledger in KEYS for one claim, or none.
--
-- A ledger is a sorted set: member = claim token, score = the millisecond
-- (Redis clock) at which that hold expires unless its holder refreshes it.
-- A member whose score is <= now has expired and counts for nobody.
--
-- KEYS[1..n]  the ledgers this claim needs (n >= 1)
-- ARGV[1]     claim token ("<host>:<pid>:<thread>:<counter>"), unique per claim
-- ARGV[2]     hold ttl in milliseconds (integer >= 1)
-- ARGV[2+i]   capacity of KEYS[i] (integer >= 1)
--
-- Returns a pair:
--   {1, 0}   admitted: the token now holds every ledger
--   {1, 1}   admitted on replay: the token already held every ledger (a
--            retried call whose first attempt landed); holds refreshed,
--            nothing counted twice
--   {0, i}   refused: KEYS[i] is the first ledger at capacity; no hold was
--            taken on any ledger (expired members were swept, nothing else)
--   {-1, j}  ARGV[j] is malformed (j = 0: wrong number of arguments); nothing written
--
-- All or nothing: every ledger is checked before any hold is written, and a
-- script runs atomically, so a claim never sits on one ledger while waiting
-- for another.

if #KEYS < 1 or #ARGV ~= #KEYS + 2 then
  return {-1, 0}
end

local token = ARGV[1]
if token == '' then
  return {-1, 1}
end

local ttl = tonumber(ARGV[2])
if not ttl or ttl < 1 or ttl ~= math.floor(ttl) then
  return {-1, 2}
end

local capacities = {}
for i = 1, #KEYS do
  local capacity = tonumber(ARGV[2 + i])
  if not capacity or capacity < 1 or capacity ~= math.floor(capacity) then
    return {-1, 2 + i}
  end
  capacities[i] = capacity
end

local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local expiry = string.format('%.0f', now + ttl)

local replay = 1
for i, ledger in ipairs(KEYS) do
  redis.call('ZREMRANGEBYSCORE', ledger, '-inf', now)
  if not redis.call('ZSCORE', ledger, token) then
    replay = 0
    if redis.call('ZCARD', ledger) >= capacities[i] then
      return {0, i}
    end
  end
end

for _, ledger in ipairs(KEYS) do
  redis.call('ZADD', ledger, expiry, token)
  -- The key lives as long as its longest hold, so an abandoned ledger
  -- (every holder gone) disappears by itself.
  local last = redis.call('ZRANGE', ledger, -1, -1, 'WITHSCORES')
  redis.call('PEXPIREAT', ledger, last[2])
end

return {1, replay}

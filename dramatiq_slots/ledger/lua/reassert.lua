-- reassert.lua: put back holds that were lost while their jobs still run.
--
-- Used by the heartbeat after beat.lua reported a hold lost (Redis restarted
-- without persistence, or the process was paused longer than the ttl). The
-- job is running whatever the ledger says, so its hold is re-added even when
-- that puts the ledger over capacity: the ledger must count what really
-- runs, and new admissions then wait until it drains.
--
-- KEYS[1..n]  ledgers
-- ARGV[1]     hold ttl in milliseconds (integer >= 1)
-- ARGV[1+i]   claim token for KEYS[i]
--
-- Returns, for each i, the number of live holds on KEYS[i] afterwards.
-- Returns {-1, j} when ARGV[j] is malformed; nothing written.

if #ARGV ~= #KEYS + 1 then
  return {-1, 0}
end
local ttl = tonumber(ARGV[1])
if not ttl or ttl < 1 or ttl ~= math.floor(ttl) then
  return {-1, 1}
end

local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local expiry = string.format('%.0f', now + ttl)

local counts = {}
for i, ledger in ipairs(KEYS) do
  redis.call('ZREMRANGEBYSCORE', ledger, '-inf', now)
  redis.call('ZADD', ledger, expiry, ARGV[1 + i])
  local last = redis.call('ZRANGE', ledger, -1, -1, 'WITHSCORES')
  redis.call('PEXPIREAT', ledger, last[2])
  counts[i] = redis.call('ZCARD', ledger)
end
return counts

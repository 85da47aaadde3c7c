-- reassert.lua: put back holds that were lost while their jobs still run.
--
-- Used by the heartbeat after beat.lua reported a hold lost (Redis restarted
-- without persistence, or the process was paused longer than the ttl). The
-- job is running whatever the ledger says, so its hold is re-added even when
-- that puts the ledger over capacity: the ledger must count what really
-- runs, and new admissions then wait until it drains.
--
-- KEYS[1..n]    ledger: the ledgers of the lost holds
-- ARGV[1]       ttl (integer >= 1): hold ttl, ms
-- ARGV[2..n+1]  token (text): the claim token of the hold on KEYS[i]
--
-- Returns list[int]: {live1, .., liven} livei = how many live holds the ledger
-- of KEYS[i] has afterwards.
-- Errors  SLOTS_ARG <j> <name>: ARGV[j] is malformed (j = 0: wrong count); nothing written

-- include: args
if #ARGV ~= #KEYS + 1 then return bad(0, 'count') end
local ttl = integer(ARGV[1], 1)
if not ttl then return bad(1, 'ttl') end

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

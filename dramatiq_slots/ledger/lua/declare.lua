-- declare.lua: one worker process says which capacities it declares, and learns
-- the operators' controls and what the other live processes declare.
--
-- Run with every heartbeat (in the beat's round trip). A process whose code
-- declares another capacity for a queue than another live process's (a rolling
-- deploy) learns it here and warns; the controls tell it what to log and which
-- ledgers are paused. Read-only on the controls. Every beat also keeps the
-- epoch alive (lib/epoch.lua), and makes it when it is missing: a worker's
-- first beat starts a brand-new deployment's settling before any admission.
--
-- KEYS[1]       the operators' controls (hash, see control.lua)
-- KEYS[2]       the epoch (lib/epoch.lua)
-- KEYS[2+i]     the declarations of ledger i (sorted set: member = a capacity,
--               score = when the latest live process declaring it stops counting, ms)
-- ARGV[1]       how long a declaration counts without being renewed, ms (integer >= 1)
-- ARGV[2]       settling time, ms (integer >= 0; as enter.lua's); 0 = the epoch is
--               neither read nor made
-- ARGV[2+i]     the capacity this process declares for ledger i (integer >= 1)
--
-- Returns {controls, settling, now, others1, .., othersn}: controls is the hash as
-- a flat list {field1, value1, ...}; settling the ms left of the epoch's settling
-- (0: settled, or not read); now the Redis clock (ms; 0: not read, when there is
-- nothing to declare and no epoch to keep), by which the process reads the expiry a
-- wake-up carries; othersi lists the other capacities that live processes declare
-- for ledger i.
-- Returns {-1, j} when ARGV[j] is malformed (j = 0: wrong count); nothing written.

local n = #KEYS - 2
if n < 0 or #ARGV ~= n + 2 then return {-1, 0} end
local ttl, settle = tonumber(ARGV[1]), tonumber(ARGV[2])
if not ttl or ttl < 1 or ttl ~= math.floor(ttl) then return {-1, 1} end
if not settle or settle < 0 or settle ~= math.floor(settle) then return {-1, 2} end
for i = 1, n do
  local cap = tonumber(ARGV[2 + i])
  if not cap or cap < 1 or cap ~= math.floor(cap) then return {-1, 2 + i} end
end

-- include: epoch
local reply = {redis.call('HGETALL', KEYS[1]), 0, 0}
if n == 0 and settle == 0 then return reply end
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
reply[3] = string.format('%.0f', now)
if settle > 0 then
  reply[2] = settling(KEYS[2], now, settle)
  keep_epoch(KEYS[2])
end
local until_ = string.format('%.0f', now + ttl)
for i = 1, n do
  local key, mine = KEYS[2 + i], ARGV[2 + i]
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  redis.call('ZADD', key, 'GT', until_, mine)
  redis.call('PEXPIRE', key, ttl)
  local others = {}
  for _, cap in ipairs(redis.call('ZRANGE', key, 0, -1)) do
    if cap ~= mine then others[#others + 1] = cap end
  end
  reply[3 + i] = others
end
return reply

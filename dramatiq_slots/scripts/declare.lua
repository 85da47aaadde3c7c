-- declare.lua: one worker process says which capacities it declares, and learns
-- the operators' controls and what the other live processes declare.
--
-- Run with every heartbeat (in the beat's round trip). A process whose code
-- declares another capacity for a queue than another live process's (a rolling
-- deploy) learns it here and warns; the controls tell it what to log and which
-- ledgers are paused. Read-only on the controls.
--
-- KEYS[1]       the operators' controls (hash, see control.lua)
-- KEYS[1+i]     the declarations of ledger i (sorted set: member = a capacity,
--               score = when the latest live process declaring it stops counting, ms)
-- ARGV[1]       how long a declaration counts without being renewed, ms (integer >= 1)
-- ARGV[1+i]     the capacity this process declares for ledger i (integer >= 1)
--
-- Returns {controls, others1, .., othersn}: controls is the hash as a flat list
-- {field1, value1, ...}; othersi lists the other capacities that live processes
-- declare for ledger i.
-- Returns {-1, j} when ARGV[j] is malformed (j = 0: wrong count); nothing written.

local n = #KEYS - 1
if n < 0 or #ARGV ~= n + 1 then return {-1, 0} end
local ttl = tonumber(ARGV[1])
if not ttl or ttl < 1 or ttl ~= math.floor(ttl) then return {-1, 1} end
for i = 1, n do
  local cap = tonumber(ARGV[1 + i])
  if not cap or cap < 1 or cap ~= math.floor(cap) then return {-1, 1 + i} end
end

local reply = {redis.call('HGETALL', KEYS[1])}
if n == 0 then return reply end
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local until_ = string.format('%.0f', now + ttl)
for i = 1, n do
  local key, mine = KEYS[1 + i], ARGV[1 + i]
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  redis.call('ZADD', key, 'GT', until_, mine)
  redis.call('PEXPIRE', key, ttl)
  local others = {}
  for _, cap in ipairs(redis.call('ZRANGE', key, 0, -1)) do
    if cap ~= mine then others[#others + 1] = cap end
  end
  reply[1 + i] = others
end
return reply

-- declare.lua: one worker process says which capacities it declares, and learns
-- the operators' controls and what the other live processes declare.
--
-- Run with every heartbeat (in the beat's round trip). A process whose code
-- declares another capacity for a queue than another live process's (a rolling
-- deploy) learns it here and warns; the controls tell it what to log and which
-- ledgers are paused. Read-only on the controls. Every beat also keeps the
-- epoch alive (lib/epoch.lua), makes it when it is missing (a worker's first
-- beat makes a brand-new deployment's, before any admission), and tells the
-- process the epoch's born, which it passes with its next calls.
--
-- KEYS[1]       controls: the operators' controls (hash, see control.lua)
-- KEYS[2]       epoch: the epoch (lib/epoch.lua)
-- KEYS[3..n+2]  declared: the declarations of ledger i (sorted set: member = a
--               capacity, score = when the latest live process declaring it stops
--               counting, ms)
-- ARGV[1]       ttl (integer >= 1): how long a declaration counts without being
--               renewed, ms
-- ARGV[2]       settle (integer >= 0): settling time, ms (as enter.lua's); 0 = the
--               epoch is neither read nor made
-- ARGV[3]       known (integer >= 0): the born of the epoch the caller last saw (as
--               enter.lua's)
-- ARGV[4..n+3]  capacity (integer >= 1): the capacity this process declares for
--               ledger i
--
-- Returns Declared: {controls, settling, now, born, lost, others1, .., othersn} controls is
-- the hash as a flat list {field1, value1, ...}; settling the ms left of the epoch's settling
-- (0: settled, or not read); now the Redis clock (ms), by which the process reads the
-- expiry a wake-up carries and whether a control has expired (lib/control.lua); born the
-- epoch's born, for the caller to know (0: not read); lost = 1 when the settling follows a
-- loss of data; othersi lists the other capacities that live processes declare for ledger i.
-- With nothing to declare and settle 0, it writes nothing: Controls.read() reads the
-- controls and the clock so.
-- Errors  SLOTS_ARG <j> <name>: ARGV[j] is malformed (j = 0: wrong count); nothing written

-- include: args
local n = #KEYS - 2
if n < 0 or #ARGV ~= n + 3 then return bad(0, 'count') end
local ttl, settle, known = integer(ARGV[1], 1), integer(ARGV[2], 0), integer(ARGV[3], 0)
if not ttl then return bad(1, 'ttl') end
if not settle then return bad(2, 'settle') end
if not known then return bad(3, 'known') end
for i = 1, n do
  if not integer(ARGV[3 + i], 1) then return bad(3 + i, 'capacity') end
end

-- include: epoch
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local reply = {redis.call('HGETALL', KEYS[1]), 0, string.format('%.0f', now), 0, 0}
if settle > 0 then
  local born
  reply[2], reply[5], born = settling(KEYS[2], now, settle, known, KEYS[1])
  reply[4] = string.format('%.0f', born)
  keep_epoch(KEYS[2])
end
local until_ = string.format('%.0f', now + ttl)
for i = 1, n do
  local key, mine = KEYS[2 + i], ARGV[3 + i]
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  redis.call('ZADD', key, 'GT', until_, mine)
  redis.call('PEXPIRE', key, ttl)
  local others = {}
  for _, cap in ipairs(redis.call('ZRANGE', key, 0, -1)) do
    if cap ~= mine then others[#others + 1] = cap end
  end
  reply[5 + i] = others
end
return reply

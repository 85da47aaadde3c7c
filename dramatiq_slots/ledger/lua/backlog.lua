-- backlog.lua: a sender lists a message on the backlogs of its limits, or is refused because one
-- of them holds as many messages as its bound (when_line_full="refuse"; Ledger.list_waiting).
--
-- A backlog counts the messages sent and not yet admitted (nor dropped) on one ledger, or on
-- one fair-share group of it: the messages in the broker, parked, held back or deferred alike.
-- enter.lua takes a message off its backlogs when it is admitted or dropped (its ARGV listed);
-- an entry nobody takes off (the broker lost the message, or the send failed after this) stops
-- counting ttl ms after it was listed.
--
-- KEYS[1..n]    backlog: the backlogs of the message's limits (sorted sets: member = message
--               id, score = until when it counts, ms)
-- ARGV[1]       message (text, not empty): the message's id
-- ARGV[2]       ttl (integer >= 1): how long an entry counts, ms
-- ARGV[3..n+2]  most (integer >= 1): the bound of KEYS[i] (max_waiting)
--
-- Returns int: integer, 0 when the message is on every backlog now (a message listed already
-- is not counted twice), else i: KEYS[i] holds ARGV[2+i] messages already (nothing written)
-- Errors  SLOTS_ARG <j> <name>: ARGV[j] is malformed (j = 0: wrong count); nothing written

-- include: args
local n = #KEYS
if n < 1 or #ARGV ~= n + 2 then return bad(0, 'count') end
local message, ttl = ARGV[1], integer(ARGV[2], 1)
if message == '' then return bad(1, 'message') end
if not ttl then return bad(2, 'ttl') end
local most = {}
for i = 1, n do
  most[i] = integer(ARGV[2 + i], 1)
  if not most[i] then return bad(2 + i, 'most') end
end
-- include: outlive

local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
for i = 1, n do
  redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now)
  if not redis.call('ZSCORE', KEYS[i], message) and redis.call('ZCARD', KEYS[i]) >= most[i] then
    return i
  end
end
local expiry = string.format('%.0f', now + ttl)
for i = 1, n do
  redis.call('ZADD', KEYS[i], expiry, message)
  outlive(KEYS[i], expiry, ttl)
end
return 0

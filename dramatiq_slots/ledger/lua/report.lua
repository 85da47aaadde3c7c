-- report.lua: write one worker process's report, and the indexes that let a reader find the
-- live reports and the ledgers without a SCAN (Ledger.write_report; also in each beat's round
-- trip, before the beat itself).
--
-- KEYS[1]       report: the process's report (a string, expiring ttl after it is written)
-- KEYS[2]       reports: the index of reports (sorted set: member = <host>:<pid>, score = when
--               its report expires, ms)
-- KEYS[3]       listed: the index of ledgers (sorted set: member = queue:<name> or
--               key:<digest>, score = until when it is listed, ms; only ever pushed later)
-- KEYS[4]       names: the same ledgers by name (sorted set, every score 0, so it reads in
--               lexicographic order: a page of ledgers, a search by the start of a name)
-- ARGV[1]       process (text, not empty): <host>:<pid>, the member of reports
-- ARGV[2]       text (text): the report (JSON)
-- ARGV[3]       ttl (integer >= 1): how long the report lives, ms
-- ARGV[4]       listed_ttl (integer >= 1): how long its ledgers stay listed at least, ms (the
--               caller gives its hold ttl and a margin: a ledger stays listed while a hold the
--               report names may still be live, after its process died)
-- ARGV[5]       n (integer >= 0): how many ledgers follow
-- ARGV[6..n+5]  ledger (text, not empty): the short name of a ledger the report names
--
-- Returns int: integer, the Redis clock the script read (ms)
-- Errors  SLOTS_ARG <j> <name>: ARGV[j] is malformed (j = 0: wrong count); nothing written
--
-- Pruning: every call removes the reports whose expiry has passed from `reports` and up to
-- 100 ledgers whose listing has passed from `listed` and `names`; each index key lives as long
-- as its latest score, so the indexes of a prefix whose workers all stopped disappear by
-- themselves. A reader may meet an entry that expired since the last write (at most one beat
-- old): a report key that is gone, a ledger that holds nothing.

-- include: args
if #KEYS ~= 4 or #ARGV < 5 then return bad(0, 'count') end
if ARGV[1] == '' then return bad(1, 'process') end
local ttl, listed_ttl, n = integer(ARGV[3], 1), integer(ARGV[4], 1), integer(ARGV[5], 0)
if not ttl then return bad(3, 'ttl') end
if not listed_ttl then return bad(4, 'listed_ttl') end
if not n then return bad(5, 'n') end
if #ARGV ~= 5 + n then return bad(0, 'count') end
for i = 1, n do
  if ARGV[5 + i] == '' then return bad(5 + i, 'ledger') end
end

local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
redis.call('SET', KEYS[1], ARGV[2], 'PX', ttl)

-- An index key lives until its latest score at least, never less than before: one PEXPIREAT
-- ... GT on Redis >= 7 and Valkey (a key without an expiry yet gets one plainly), PTTL first on 6.2.
local gt = (redis.REDIS_VERSION_NUM or 0) >= 0x070000
local function outlast(key, at)
  if gt and redis.call('PEXPIREAT', key, at, 'GT') == 1 then return end
  local left = redis.call('PTTL', key)
  if left == -1 or left < tonumber(at) - now then redis.call('PEXPIREAT', key, at) end
end

redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
local expires = string.format('%.0f', now + ttl)
redis.call('ZADD', KEYS[2], expires, ARGV[1])
outlast(KEYS[2], expires)

local gone = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now, 'LIMIT', 0, 100)
if #gone > 0 then
  redis.call('ZREM', KEYS[3], unpack(gone))
  redis.call('ZREM', KEYS[4], unpack(gone))
end
if n > 0 then
  local until_ms = string.format('%.0f', now + listed_ttl)
  for first = 1, n, 200 do
    local scored, named = {}, {}
    for i = first, math.min(n, first + 199) do
      scored[#scored + 1] = until_ms
      scored[#scored + 1] = ARGV[5 + i]
      named[#named + 1] = 0
      named[#named + 1] = ARGV[5 + i]
    end
    redis.call('ZADD', KEYS[3], 'GT', unpack(scored))
    redis.call('ZADD', KEYS[4], unpack(named))
  end
  outlast(KEYS[3], until_ms)
  outlast(KEYS[4], until_ms)
end
return now

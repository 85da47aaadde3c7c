-- beat.lua: one heartbeat of one process, in one round trip: refresh every
-- hold it has, and retry the releases that failed earlier.
--
-- KEYS[1..r]     ledgers of the holds to refresh
-- KEYS[r+1..n]   ledgers of holds to release (releases that failed before)
-- ARGV[1]        hold ttl in milliseconds (integer >= 1)
-- ARGV[2]        r, how many KEYS are refreshes (0 <= r <= n)
-- ARGV[2+i]      claim token for KEYS[i]
--
-- Returns the list of indexes i (1 <= i <= r) whose hold was lost: the
-- member was gone (Redis lost it) or had already expired (the holder was
-- silent longer than the ttl). A lost hold is NOT re-created here: a
-- refresh only extends members that exist (ZADD XX), so a beat racing a
-- release can never resurrect the released hold. The caller decides, under
-- its own lock, whether to re-assert (reassert.lua).
-- Returns {-1, j} when ARGV[j] is malformed; nothing written.
--
-- Each refreshed ledger is also swept of expired members (holders that died):
-- admission (enter.lua) counts members, not live holds, so the beats of the
-- live holders are what return a dead holder's slot.

local ttl = tonumber(ARGV[1])
local r = tonumber(ARGV[2])
if #ARGV ~= #KEYS + 2 then
  return {-1, 0}
end
if not ttl or ttl < 1 or ttl ~= math.floor(ttl) then
  return {-1, 1}
end
if not r or r < 0 or r > #KEYS or r ~= math.floor(r) then
  return {-1, 2}
end

local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local expiry = string.format('%.0f', now + ttl)

local lost, swept = {}, {}
for i = 1, r do
  local ledger, token = KEYS[i], ARGV[2 + i]
  if not swept[ledger] then
    swept[ledger] = true
    redis.call('ZREMRANGEBYSCORE', ledger, '-inf', now)
  end
  local score = redis.call('ZSCORE', ledger, token)
  if score and tonumber(score) > now then
    redis.call('ZADD', ledger, 'XX', expiry, token)
    local last = redis.call('ZRANGE', ledger, -1, -1, 'WITHSCORES')
    redis.call('PEXPIREAT', ledger, last[2])
  else
    if score then
      redis.call('ZREM', ledger, token)
    end
    lost[#lost + 1] = i
  end
end

for i = r + 1, #KEYS do
  redis.call('ZREM', KEYS[i], ARGV[2 + i])
end

return lost

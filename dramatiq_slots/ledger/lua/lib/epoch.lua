-- lib/epoch.lua: whether the ledgers of a prefix are settling, after their Redis lost its
-- data or before a brand-new deployment's first admission (inlined where a script says
-- "-- include: epoch"; see docs/design.md, "Restarted empty: the epoch").
--
-- The epoch key ({<prefix>}:epoch) is a sorted set of one member, "settled", scored by the
-- millisecond (Redis clock) from which newcomers may be admitted. Every worker's beat keeps
-- it alive (declare.lua), so it is absent only when the server lost it (restarted without
-- persistence, failed over to a replica that never had it) or never had it (a deployment that
-- has not beaten for EPOCH_KEEP_MS, or a new one). Its absence means holds of running jobs
-- may have been lost with it: it is made again, settling for `settle` ms, during which no
-- newcomer is admitted and nothing is handed on from a line, while the heartbeats of the
-- processes whose jobs still run re-assert their holds (reassert.lua, reclaim.lua).
--
-- settling(key, now, settle): the ms left of the settling (0: settled); a missing key is
-- made (ZSCORE; then ZADD and PEXPIRE). keep_epoch(key): push its expiry on (PEXPIRE).

local EPOCH_KEEP_MS = 86400000

local function settling(key, now, settle)
  local settled = redis.call('ZSCORE', key, 'settled')
  if not settled then
    settled = now + settle
    redis.call('ZADD', key, string.format('%.0f', settled), 'settled')
    redis.call('PEXPIRE', key, EPOCH_KEEP_MS)
  end
  local left = tonumber(settled) - now
  if left > 0 then return left end
  return 0
end

local function keep_epoch(key)
  redis.call('PEXPIRE', key, EPOCH_KEEP_MS)
end

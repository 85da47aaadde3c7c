-- lib/epoch.lua: whether the ledgers of a prefix (or of one home) are settling after their
-- Redis lost its data (inlined where a script says "-- include: epoch"; see docs/design.md,
-- "Restarted empty: the epoch").
--
-- The epoch key ({<prefix>}:epoch) is a sorted set of up to three members: "settled", scored
-- by the millisecond (Redis clock) from which newcomers may be admitted; "born", the millisecond
-- it was made (its identity: every process remembers the born of the epoch it last saw); and
-- "lost", present when the settling follows a loss of data. Every worker's beat keeps it alive
-- (declare.lua), so it is absent only when the server lost it (restarted without persistence,
-- failed over to a replica that never had it, flushed) or never had it (a new deployment, or one
-- that has not beaten for EPOCH_KEEP_MS).
--
-- Made again, it tells the live processes (a PUBLISH on the controls channel makes each beat at
-- once, re-asserting the holds the server forgot) and settles for as long as the holders may
-- need, during which no newcomer is admitted and nothing is handed on from a line:
-- - `settle` ms (restart_settle), with "lost", when its absence is a loss: the caller knew an
--   epoch (`known` > 0), or a live process hears the PUBLISH (it booted under an epoch: a process
--   subscribes only after its first beat);
-- - else it is a first start (nobody knew an epoch, nobody listens), and it settles only until
--   the server has been up for FIRST_START_UP_MS: a server that has just restarted is given that
--   long for its live processes to reconnect (they retry every 0.25 s, and each then beats with
--   the epoch it knew, which lengthens the settling to a loss's). INFO's uptime counts the whole
--   seconds of the clock since the start's (s of them: the server started before the second
--   now's began, less s - 1), so it has been up at least s - 1 seconds and the ms into this one;
--   when INFO is refused (the README's ACL), the server may have just started: it waits the
--   whole FIRST_START_UP_MS.
-- A caller that knew another epoch than the one in course while it settles lengthens it to
-- `settle` ms from its birth (a loss the first start did not know of), and marks it "lost".
--
-- settling(key, now, settle, known, controls): the ms left of the settling (0: settled), whether
-- it follows a loss (1) or not (0), and the epoch's born; a missing key is made (one ZRANGE; then
-- PUBLISH, INFO when nobody listens, ZADD and PEXPIRE). keep_epoch(key): push its expiry on
-- (PEXPIRE).

local EPOCH_KEEP_MS = 86400000
local FIRST_START_UP_MS = 500

local function settling(key, now, settle, known, controls)
  local e, at = redis.call('ZRANGE', key, 0, -1, 'WITHSCORES'), {}
  for i = 1, #e, 2 do at[e[i]] = tonumber(e[i + 1]) end
  if not at.settled then
    local heard = redis.call('PUBLISH', controls, '')
    local left, lost = settle, known > 0 or heard > 0
    if not lost then
      local info = redis.pcall('INFO', 'server')
      local up = type(info) == 'string' and tonumber(string.match(info, 'uptime_in_seconds:(%d+)'))
      local lower = up and math.max(0, (up - 1) * 1000 + now % 1000) or 0
      left = math.max(0, math.min(settle, FIRST_START_UP_MS - lower))
    end
    redis.call('ZADD', key, string.format('%.0f', now + left), 'settled', string.format('%.0f', now), 'born')
    if lost then redis.call('ZADD', key, string.format('%.0f', now), 'lost') end
    redis.call('PEXPIRE', key, EPOCH_KEEP_MS)
    return left, lost and 1 or 0, now
  end
  local left, born = at.settled - now, at.born or 0
  if left <= 0 then return 0, 0, born end
  if known > 0 and born > 0 and born ~= known then
    if born + settle > at.settled then
      redis.call('ZADD', key, string.format('%.0f', born + settle), 'settled')
      left = born + settle - now
    end
    if not at.lost then redis.call('ZADD', key, string.format('%.0f', now), 'lost') end
    return left, 1, born
  end
  return left, at.lost and 1 or 0, born
end

local function keep_epoch(key)
  redis.call('PEXPIRE', key, EPOCH_KEEP_MS)
end

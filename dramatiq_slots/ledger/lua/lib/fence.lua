-- lib/fence.lua: the next fencing token of a ledger (inlined where a script says
-- "-- include: fence"; see docs/design.md, "Fencing tokens").
--
-- fence(key, ttl, now): a number greater than every one given before on the
-- ledger whose fence key is `key`: the last one + 1 while the key exists, else
-- the Redis clock in microseconds (TIME, read here when `now`, in us, is nil).
-- The key is a sorted set whose one member, "last", is scored by the last fence
-- (a score holds any integer below 2^53 exactly, and the workers' ACL has the
-- sorted-set commands already); a new key expires ttl ms later, and its expiry
-- is never pushed. ZSCORE and ZADD (and TIME and PEXPIRE for a new key).
--
-- Why it never goes backwards: while the key lives, each fence is the last + 1.
-- A key starts at the clock, and its fences grow by one per admission, far
-- slower than the clock's microseconds, so no fence is ahead of the clock (by
-- more than the few a single beat hands out at once). When the key is gone (ttl
-- after it was made, a restart that lost it, a failover that did not replicate
-- it) the next fence is the clock, past every fence given before, as long as the
-- server's clock never runs behind the clock of the one that gave the last fence
-- (the one assumption; docs/design.md, "Fencing tokens").

local function fence(key, ttl, now)
  local last = redis.call('ZSCORE', key, 'last')
  local next_fence
  if last then
    next_fence = tonumber(last) + 1
  else
    if not now then
      local clock = redis.call('TIME')
      now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
    end
    next_fence = now
  end
  redis.call('ZADD', key, string.format('%.0f', next_fence), 'last')
  if not last then redis.call('PEXPIRE', key, ttl) end
  return next_fence
end

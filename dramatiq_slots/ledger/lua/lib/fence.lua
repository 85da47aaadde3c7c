-- lib/fence.lua: the next fencing token of a ledger (inlined where a script says
-- "-- include: fence"; see docs/design.md, "Fencing tokens").
--
-- fence(key, ttl, now): a number greater than every one given before on the
-- ledger whose fence key is `key`: the last one + 1 while the key exists, else
-- the Redis clock in microseconds (TIME, read here when `now`, in us, is nil).
-- The key is a sorted set whose one member, "last", is scored by the last fence
-- (a score holds any integer below 2^53 exactly, and the workers' ACL has the
-- sorted-set commands already); a new key expires ttl ms later, and its expiry
-- is never pushed. One ZINCRBY (a new key: then ZADD, PEXPIRE, and TIME unless
-- `now` is given; ZINCRBY answers exactly: fences stay below 2^53).
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
  local next_fence = tonumber(redis.call('ZINCRBY', key, 1, 'last'))
  if next_fence == 1 then
    -- A new key (no fence given since it was made): it starts at the clock.
    if not now then
      local clock = redis.call('TIME')
      now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
    end
    next_fence = now
    redis.call('ZADD', key, string.format('%.0f', next_fence), 'last')
    redis.call('PEXPIRE', key, ttl)
  end
  return next_fence
end

-- lib/tell.lua: tell a claim in line that it was handed a slot (inlined where a
-- script says "-- include: tell"; see dramatiq_slots.wakeups for the message).
--
-- tell(channel, own, waiter, age, ledger): publishes "<waiter> <age> <ledger>"
-- on the wake channel of the waiter's process (channel prefix + the token
-- without its last two ':' fields). Returns 'own' for a waiter of the caller's
-- own process (the caller wakes it itself: no PUBLISH), true when that
-- channel had a subscriber, false when nobody listens (the process is gone,
-- or not subscribed): the caller then takes the handed hold back.

local function tell(channel, own, waiter, age, ledger)
  local process = string.match(waiter, '^(.*):[^:]*:[^:]*$') or waiter
  if process == own then return 'own' end
  return redis.call('PUBLISH', channel .. process, waiter .. ' ' .. age .. ' ' .. ledger) > 0
end

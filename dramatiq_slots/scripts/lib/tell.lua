-- lib/tell.lua: tell a claim in line that it was handed a slot (inlined where a
-- script says "-- include: tell"; see dramatiq_slots.wakeups for the message).
--
-- tell(channel, own, waiter, age, ledger, fence): publishes "<waiter> <age>
-- <fence> <ledger>" (the ledger last: its name may hold spaces)
-- on the wake channel of the waiter's process (channel prefix + the token
-- without its last two ':' fields). Returns 'own' for a waiter of the caller's
-- own process (the caller wakes it itself: no PUBLISH), true when that
-- channel had a subscriber, false when nobody listens (the process is gone,
-- or not subscribed): the caller then takes the handed hold back.

local function tell(channel, own, waiter, age, ledger, fence)
  local process = string.match(waiter, '^(.*):[^:]*:[^:]*$') or waiter
  if process == own then return 'own' end
  local message = waiter .. ' ' .. age .. ' ' .. string.format('%.0f', fence) .. ' ' .. ledger
  return redis.call('PUBLISH', channel .. process, message) > 0
end

-- lib/tell.lua: tell a claim in line that it was handed a slot (inlined where a
-- script says "-- include: tell"; see dramatiq_slots.wakeups for the message).
--
-- tell(channel, own, waiter, expiry, ledger, fence): publishes "<waiter> <expiry>
-- <fence> <ledger>" (the ledger last: its name may hold spaces), <expiry> the handed
-- hold's score (ms, Redis clock): a message that arrives late (a stalled network)
-- still says how much of the hold is left, which an age could not
-- on the wake channel of the waiter's process (channel prefix + the token
-- without its last two ':' fields). Returns 'own' for a waiter of the caller's
-- own process (the caller wakes it itself: no PUBLISH), true when that
-- channel had a subscriber, false when nobody listens (the process is gone,
-- or not subscribed): the caller then takes the handed hold back.

local function tell(channel, own, waiter, expiry, ledger, fence)
  local process = string.match(waiter, '^(.*):[^:]*:[^:]*$') or waiter
  if process == own then return 'own' end
  local message = waiter .. ' ' .. expiry .. ' ' .. string.format('%.0f', fence) .. ' ' .. ledger
  return redis.call('PUBLISH', channel .. process, message) > 0
end

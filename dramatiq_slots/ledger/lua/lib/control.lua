-- lib/control.lua: what the operators' controls say of ledgers (inlined where a
-- script says "-- include: control"; the controls are written by control.lua, see
-- dramatiq_slots.controls).
--
-- control(controls, ledgers, declared): for each ledger i, the capacity in force
-- (the operator's override when one is set, else declared[i], what the caller's
-- actor or settings declare; 0 = unknown) and whether it is paused: two tables.
-- One HMGET for all of them.

local function control(controls, ledgers, declared)
  local fields = {}
  for i, ledger in ipairs(ledgers) do
    fields[2 * i - 1] = 'capacity:' .. ledger
    fields[2 * i] = 'paused:' .. ledger
  end
  local values = redis.call('HMGET', controls, unpack(fields))
  local caps, paused = {}, {}
  for i = 1, #ledgers do
    caps[i] = tonumber(values[2 * i - 1]) or declared[i]
    paused[i] = values[2 * i] ~= false
  end
  return caps, paused
end

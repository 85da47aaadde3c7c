-- lib/control.lua: what the operators' controls say of one ledger (inlined where a
-- script says "-- include: control"; the controls are written by control.lua, see
-- dramatiq_slots.controls).
--
-- control(controls, ledger, declared): the ledger's capacity in force and whether
-- it is paused. The capacity is the operator's override when one is set, else
-- `declared` (what the caller's actor or settings declare; 0 = unknown). One HMGET.

local function control(controls, ledger, declared)
  local c = redis.call('HMGET', controls, 'capacity:' .. ledger, 'paused:' .. ledger)
  return tonumber(c[1]) or declared, c[2] ~= false
end

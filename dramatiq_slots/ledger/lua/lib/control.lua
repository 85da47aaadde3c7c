-- lib/control.lua: what the operators' controls say of ledgers (inlined where a
-- script says "-- include: control"; the controls are written by control.lua, see
-- dramatiq_slots.ledger.controls).
--
-- A control's value is '<v>' (in force until changed) or '<v>:<until>' (in force
-- while the Redis clock, in ms, is before <until>): v is the override's capacity
-- (capacity:<ledger>) or when the ledger was paused (paused:<ledger>). An expired
-- value is absent for every script from its until on, without anyone deleting it
-- (control.lua deletes it with its next write). Who set a control (its meta:
-- field) is never read here.
--
-- control(controls, ledgers, declared, now): for each ledger i, the capacity in
-- force (the operator's override when one is in force, else declared[i], what the
-- caller's actor or settings declare; 0 = unknown) and whether it is paused: two
-- tables. One HMGET for all of them; now is the Redis clock (ms) when the caller
-- has read it, else nil: TIME is then read only if a value has an until.

local function control(controls, ledgers, declared, now)
  local fields = {}
  for i, ledger in ipairs(ledgers) do
    fields[2 * i - 1] = 'capacity:' .. ledger
    fields[2 * i] = 'paused:' .. ledger
  end
  local values = redis.call('HMGET', controls, unpack(fields))
  -- The value's head while it is in force, else nil (absent, or expired).
  local function in_force(value)
    if not value then return nil end
    local head, ends = string.match(value, '^(%d+):(%d+)$')
    if not head then return value end
    if not now then
      local clock = redis.call('TIME')
      now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
    end
    if now < tonumber(ends) then return head end
    return nil
  end
  local caps, paused = {}, {}
  for i = 1, #ledgers do
    caps[i] = tonumber(in_force(values[2 * i - 1])) or declared[i]
    paused[i] = in_force(values[2 * i]) ~= nil
  end
  return caps, paused
end

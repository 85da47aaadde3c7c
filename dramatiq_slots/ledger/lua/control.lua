-- control.lua: an operator sets or clears one control of one ledger, and the
-- workers are told (dramatiq_slots.controls; the only script that writes them).
--
-- Workers read the controls inside every admission, release and beat
-- (lib/control.lua), so a change is in force for the next of them; the message
-- on the channel makes every listening worker beat at once, which hands room a
-- raise (or a resume) made to the first claims in line, and refreshes what each
-- process shows and logs.
--
-- KEYS[1]   controls: the operators' controls (hash): capacity:<ledger> = an
--           integer >= 1, paused:<ledger> = when it was paused (ms, Redis clock)
-- ARGV[1]   ledger (text, not empty): the ledger's key
-- ARGV[2]   which ('capacity' or 'paused'): which control
-- ARGV[3]   value ('', an integer >= 1 or '1'): 'capacity': the new capacity
--           (below 2^31), '' to clear it; 'paused': '1' to pause, '' to resume
-- ARGV[4]   channel (text): the channel the workers listen on for changes
--
-- Returns Changed: {changed, before} changed = 1 when the control now differs from
-- before; before = its previous value ('' when it had none).
-- Errors  SLOTS_ARG <j> <name>: ARGV[j] is malformed (j = 0: wrong count); nothing written

-- include: args
if #KEYS ~= 1 or #ARGV ~= 4 then return bad(0, 'count') end
local ledger, which, value, channel = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
if ledger == '' then return bad(1, 'ledger') end
if which ~= 'capacity' and which ~= 'paused' then return bad(2, 'which') end
if value ~= '' then
  if which == 'capacity' then
    local cap = integer(value, 1)
    if not cap or cap >= 2 ^ 31 then return bad(3, 'value') end
    value = string.format('%d', cap)
  elseif value ~= '1' then
    return bad(3, 'value')
  end
end

local field = which .. ':' .. ledger
local before = redis.call('HGET', KEYS[1], field) or ''
local changed = 0
if value == '' then
  changed = redis.call('HDEL', KEYS[1], field)
elseif which == 'paused' then
  if before == '' then
    local clock = redis.call('TIME')
    redis.call('HSET', KEYS[1], field, string.format('%.0f', tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)))
    changed = 1
  end
elseif before ~= value then
  redis.call('HSET', KEYS[1], field, value)
  changed = 1
end
if changed == 1 then redis.call('PUBLISH', channel, ledger) end
return {changed, before}

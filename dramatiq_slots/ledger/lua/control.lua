-- control.lua: an operator sets or clears one control of one ledger, and the
-- workers are told (dramatiq_slots.ledger.controls; the only script that writes them).
--
-- Workers read the controls inside every admission, release and beat
-- (lib/control.lua), so a change is in force for the next of them; the message
-- on the channel makes every listening worker beat at once, which hands room a
-- raise (or a resume) made to the first claims in line, and refreshes what each
-- process shows and logs.
--
-- KEYS[1]   controls: the operators' controls (hash): capacity:<ledger> = an
--           integer >= 1, paused:<ledger> = when it was paused (ms, Redis clock),
--           each followed by ':<until>' when it expires (lib/control.lua);
--           meta:<which>:<ledger> = who set it, JSON {by, at, reason};
--           cleared:<which>:<ledger> = who cleared it last, JSON {by, at, reason};
--           released:<ledger> = who released holds by hand last, JSON {by, at, reason, holds}
-- ARGV[1]   ledger (text, not empty): the ledger's key
-- ARGV[2]   which ('capacity', 'paused' or 'released'): which control ('released': a
--           release of holds by hand, recorded after it was done; no value is set)
-- ARGV[3]   value ('', an integer >= 1 or '1'): 'capacity': the new capacity
--           (below 2^31), '' to clear it; 'paused': '1' to pause, '' to resume;
--           'released': how many holds were removed
-- ARGV[4]   channel (text): the channel the workers listen on for changes
-- ARGV[5]   by (text, not empty): who sets or clears it (recorded)
-- ARGV[6]   reason (text): why ('': not said; recorded)
-- ARGV[7]   duration (integer >= 0): how long a value stays in force from now, ms
--           (below 2^40; the script writes until = now + duration); 0 = until it is
--           changed. Only with a value
--
-- Returns Changed: {changed, before} changed = 1 when the control now differs from
-- before (its value, its until, who set it or why); before = its previous value, as
-- lib/control.lua reads it ('' when it had none, or it had expired).
-- Errors  SLOTS_ARG <j> <name>: ARGV[j] is malformed (j = 0: wrong count); nothing written
--
-- Pausing a paused ledger keeps when it was paused (its value's head) and takes the
-- new until and meta. Every write first deletes what has expired under the prefix:
-- expired values with their meta, and cleared: and released: records older than a day
-- (they tell the workers who cleared a control, at their next beat, and the readers who
-- released holds). Every write then sets the hash's
-- expiry: none while a value has no until, else the last until or cleared: record's day.

-- include: args
if #KEYS ~= 1 or #ARGV ~= 7 then return bad(0, 'count') end
local ledger, which, value, channel = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local by, reason, duration = ARGV[5], ARGV[6], integer(ARGV[7], 0)
if ledger == '' then return bad(1, 'ledger') end
if which ~= 'capacity' and which ~= 'paused' and which ~= 'released' then return bad(2, 'which') end
if value ~= '' then
  if which == 'capacity' or which == 'released' then
    local cap = integer(value, 1)
    if not cap or cap >= 2 ^ 31 then return bad(3, 'value') end
    value = string.format('%d', cap)
  elseif value ~= '1' then
    return bad(3, 'value')
  end
elseif which == 'released' then
  return bad(3, 'value')
end
if by == '' then return bad(5, 'by') end
if not duration or duration >= 2 ^ 40 or ((value == '' or which == 'released') and duration > 0) then
  return bad(7, 'duration')
end

local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local KEPT = 86400000  -- how long a cleared: record is kept, ms

-- The sweep: what no reader counts any more.
local flat = redis.call('HGETALL', KEYS[1])
local present = {}
for i = 1, #flat, 2 do present[flat[i]] = flat[i + 1] end
for name, held in pairs(present) do
  local kind = string.match(name, '^(%a+):')
  if kind == 'capacity' or kind == 'paused' then
    local ends = string.match(held, '^%d+:(%d+)$')
    if ends and tonumber(ends) <= now then
      redis.call('HDEL', KEYS[1], name, 'meta:' .. name)
      present[name] = nil
    end
  elseif kind == 'cleared' or kind == 'released' then
    local read, record = pcall(cjson.decode, held)
    if not read or type(record) ~= 'table' or not tonumber(record.at) or tonumber(record.at) < now - KEPT then
      redis.call('HDEL', KEYS[1], name)
    end
  end
end

local field = which .. ':' .. ledger
local meta, cleared = 'meta:' .. field, 'cleared:' .. field
local before = present[field] or ''
local record = {by = by, at = now}
if reason ~= '' then record.reason = reason end
local changed = 0
if which == 'released' then
  record.holds = tonumber(value)
  redis.call('HSET', KEYS[1], field, cjson.encode(record))
  changed = 1
elseif value == '' then
  if before ~= '' then
    redis.call('HDEL', KEYS[1], field, meta)
    redis.call('HSET', KEYS[1], cleared, cjson.encode(record))
    changed = 1
  end
else
  if which == 'paused' then
    value = string.match(before, '^(%d+)') or string.format('%.0f', now)
  end
  if duration > 0 then value = value .. ':' .. string.format('%.0f', now + duration) end
  local same = false
  if value == before and present[meta] then
    local read, was = pcall(cjson.decode, present[meta])
    same = read and type(was) == 'table' and was.by == by and (was.reason or '') == reason
  end
  if not same then
    redis.call('HSET', KEYS[1], field, value, meta, cjson.encode(record))
    redis.call('HDEL', KEYS[1], cleared)
    changed = 1
  end
end
-- The hash lives as long as something in it is needed: for ever while a value has no until,
-- else until the last until or the last cleared: record's day is over (no key lives for ever
-- once every control is cleared or expiring).
local last, forever = 0, false
flat = redis.call('HGETALL', KEYS[1])
for i = 1, #flat, 2 do
  local name, held = flat[i], flat[i + 1]
  local kind = string.match(name, '^(%a+):')
  if kind == 'capacity' or kind == 'paused' then
    local ends = string.match(held, '^%d+:(%d+)$')
    if ends then last = math.max(last, tonumber(ends)) else forever = true end
  elseif kind == 'cleared' or kind == 'released' then
    local read, kept = pcall(cjson.decode, held)
    local at = read and type(kept) == 'table' and tonumber(kept.at) or now
    last = math.max(last, at + KEPT)
  end
end
if forever then
  redis.call('PERSIST', KEYS[1])
elseif #flat > 0 then
  redis.call('PEXPIREAT', KEYS[1], string.format('%.0f', math.max(last, now + 1)))
end
if changed == 1 then redis.call('PUBLISH', channel, ledger) end
return {changed, before}

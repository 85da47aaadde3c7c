-- holders.lua: the live holds of one ledger, by the Redis clock.
--
-- KEYS[1]  ledger: the ledger
-- ARGV     none
--
-- Returns list[Holder]: {token1, ms_left1, units1, token2, ms_left2, units2, ...} a flat list
-- of the holds whose expiry is still ahead, soonest to expire first, one per claim (a claim of
-- several units, lib/turns.lua, by its first member, with how many of its members are live);
-- ms_left is an integer number of milliseconds. Expired members are left for a beat (or a
-- reassert, a reclaim) to sweep: this script only reads.
-- Errors  SLOTS_ARG 0 count: called with other keys or arguments

-- include: args
if #KEYS ~= 1 or #ARGV ~= 0 then return bad(0, 'count') end

local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local live = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. string.format('%.0f', now), '+inf', 'WITHSCORES')
local out, at = {}, {}
for i = 1, #live, 2 do
  local member = live[i]
  local main = string.match(member, '^(.*)#%d+$')
  if main then
    if at[main] then out[at[main] + 2] = out[at[main] + 2] + 1 end
  else
    out[#out + 1] = member
    at[member] = #out
    out[#out + 1] = math.floor(tonumber(live[i + 1]) - now)
    out[#out + 1] = 1
  end
end
return out

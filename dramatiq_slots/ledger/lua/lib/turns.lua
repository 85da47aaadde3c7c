-- lib/turns.lua: what a claim's member says of it, and who gets the next slot of a ledger
-- (inlined where a script says "-- include: turns", after outlive; docs/design.md, "Who gets the
-- next slot").
--
-- A claim's member (its name in a ledger and in a line) is its token followed by what its
-- message asks for: <token>[*<units>][@<group>[^<weight>][%<share>]].
--   <units> (>= 2): the slots it takes on each of its ledgers. It holds the members <member>,
--     <member>#2 .. <member>#<units>, all with one expiry, so ZCARD counts units; it takes at
--     most the capacity in force (need = min(units, capacity)).
--   <group> (hex): its fair-share group on its ledgers; <weight> (>= 1, default 1) and <share>
--     (per mille of the capacity, 1..1000; none: no bound) are the weight and the maximum share
--     of its group, as the first claim of the group in line says.
--
-- Per ledger, besides the ledger and its line (the line of the claims without a group):
--   shares         sorted set (the workers' ACL writes no hash): <group> scored by the units
--                  the group holds; '*' by the units all groups hold (the claims without a group
--                  hold ZCARD - '*'); t<group> by the group's turn: the ledger's count of turns
--                  ('#', from when turns began), taken when it was last served, or when it
--                  started waiting, forgotten once it neither waits nor holds; =<group> by the turn
--                  its entry in turns carries (t and = for the claims without a group); 'cap' by
--                  the capacity the entries were ranked with. Lives as long as its holds and its
--                  lines (pushed by both).
--   turns          sorted set: one entry per group that waits, member '<its turn, 16
--                  digits>|<group>', score <priority class of its first claim> * 2^33 + <units
--                  the group holds> / <weight>. Its first entry is served next: the best
--                  priority, then the group that holds the fewest slots for its weight, then the
--                  group that has waited longest for its turn (served longest ago). A group that
--                  its first claim would take past its maximum share scores +inf: its claims wait
--                  (and while every entry does, nobody is served). 'cap' in shares is the
--                  capacity the entries were ranked with: a script that finds another in force
--                  ranks them all again (O(g), once per change of capacity).
--   turns|<group>  sorted set: the group's line (member -> score, as a line).
-- While no claim with a group waits, turns does not exist and the line is served first come,
-- first served (by score), as a ledger whose claims carry no group always is. Once one waits,
-- the claims without a group take turns as one more group, ''.
--
-- The first claim in turn is served when the room fits its need; while it does not, nothing
-- goes to the claims after it (room is reserved for a heavy claim as holds drain), and a
-- newcomer is not admitted past it (enter.lua).
--
-- Cost per handoff: O(log n) in the claims waiting, O(log g) in the groups waiting. A ledger
-- context L = T.ledger(ledger, line, shares, turns, capacity, ttl) is made per ledger a script
-- serves; L.grouped (turns exists) is read once, when first needed (L.head: the line's head
-- read on the way, until the line is written); L.leaving is how many
-- units of a leaving claim are still members though its group's shares no longer count them.
-- A script that does not know the capacity in force (0) ranks groups by the one they were last
-- ranked with ('cap').

local T = {}
local CLASS = 2 ^ 42
local HELD_SPAN = 2 ^ 33

function T.units(member)
  local units = string.match(member, '%*(%d+)')
  return units and tonumber(units) or 1
end

function T.group(member)
  return string.match(member, '@(%x+)') or ''
end

function T.weight(member)
  local weight = tonumber(string.match(member, '%^(%d+)') or 1)
  if weight < 1 then return 1 end
  return weight
end

function T.share(member)
  return tonumber(string.match(member, '%%(%d+)') or 0)
end

-- The unit members of a claim holding `count` units.
function T.names(member, count)
  local names = {member}
  for k = 2, count do names[k] = member .. '#' .. k end
  return names
end

function T.ledger(ledger, line, shares, turns, cap, ttl)
  return {ledger = ledger, line = line, shares = shares, turns = turns, cap = cap, ttl = ttl}
end

-- The capacity in force: the script's, else the one the groups were last ranked with (0: none).
function T.capacity(L)
  if L.cap > 0 then return L.cap end
  if L.ranked == nil then L.ranked = tonumber(redis.call('ZSCORE', L.shares, 'cap') or 0) end
  return L.ranked
end

function T.need(L, member)
  local cap = T.capacity(L)
  if cap <= 0 then return T.units(member) end
  return math.min(T.units(member), cap)
end

-- Push a key's expiry to at least ttl from now (never brought forward).
function T.keep(key, ttl)
  if redis.call('PTTL', key) * 2 < ttl then redis.call('PEXPIRE', key, ttl) end
end

-- Whether a group waits (turns exists). After T.waits found one of the line and turns, the
-- line's head tells which (kept for T.first: no second EXISTS on a leave's path).
function T.is_grouped(L)
  if L.grouped == nil then
    if L.either then
      L.head = redis.call('ZRANGE', L.line, 0, 0, 'WITHSCORES')
      L.grouped = L.head[1] == nil
    else
      L.grouped = redis.call('EXISTS', L.turns) == 1
    end
  end
  return L.grouped
end

-- The units a group holds.
function T.held(L, group)
  if group == '' then
    local grouped = tonumber(redis.call('ZSCORE', L.shares, '*') or 0)
    return math.max(0, redis.call('ZCARD', L.ledger) - grouped - (L.leaving or 0))
  end
  return tonumber(redis.call('ZSCORE', L.shares, group) or 0)
end

-- A group's holds changed by `delta` units (a removal never takes it below 0); `expiry`, when
-- given, is the newest hold's (the hash outlives it).
function T.count(L, group, delta, expiry)
  if group == '' or delta == 0 then return end
  local left = tonumber(redis.call('ZINCRBY', L.shares, delta, group))
  if left <= 0 then
    redis.call('ZREM', L.shares, group)
    delta = delta - left  -- it held less than that: only what it held leaves the total
  end
  if delta ~= 0 and tonumber(redis.call('ZINCRBY', L.shares, delta, '*')) <= 0 then
    redis.call('ZREM', L.shares, '*')
  end
  if expiry then outlive(L.shares, expiry, L.ttl) end
end

-- Claim `member` holds `count` units expiring at `expiry` (a string); the members it added.
function T.write(L, member, count, expiry, mode)
  local args = {}
  for _, name in ipairs(T.names(member, count)) do
    args[#args + 1] = expiry
    args[#args + 1] = name
  end
  local added
  if mode then
    added = redis.call('ZADD', L.ledger, mode, unpack(args))
  else
    added = redis.call('ZADD', L.ledger, unpack(args))
  end
  T.count(L, T.group(member), added, expiry)
  return added
end

-- Every unit of claim `member` leaves the ledger; how many it had there.
function T.drop(L, member)
  local removed = redis.call('ZREM', L.ledger, unpack(T.names(member, T.units(member))))
  T.count(L, T.group(member), -removed)
  return removed
end

-- The members expired by `now` (ms) leave the ledger, their groups' shares with them; the
-- groups whose holds changed (a set), or nil when none expired.
function T.sweep(L, now)
  local gone = redis.call('ZRANGEBYSCORE', L.ledger, '-inf', now)
  if #gone == 0 then return nil end
  redis.call('ZREMRANGEBYSCORE', L.ledger, '-inf', now)
  local per = {}
  for _, member in ipairs(gone) do
    local group = T.group(member)
    per[group] = (per[group] or 0) + 1
  end
  for group, count in pairs(per) do T.count(L, group, -count) end
  return per
end

function T.line_of(L, group)
  if group == '' then return L.line end
  return L.turns .. '|' .. group
end

-- The most units a group of maximum share `share` (per mille) may hold; nil: no bound.
function T.most(L, share)
  if share <= 0 then return nil end
  local cap = T.capacity(L)
  if cap <= 0 then return nil end
  return math.max(1, math.floor(cap * share / 1000))
end

-- A group's entry in turns, from its turn (a number, or its text as Redis gave it).
function T.entry(turn, group)
  return string.format('%016.0f', tonumber(turn)) .. '|' .. group
end

-- A group's entry in turns, made anew from its first claim and its holds (none when its line
-- is empty; +inf when its first claim would take it past its maximum share).
function T.rerank(L, group)
  local grouped = T.is_grouped(L)
  if group == '' and not grouped then return end
  T.sync(L)
  local field = '=' .. group
  local old = grouped and redis.call('ZSCORE', L.shares, field)
  if old then redis.call('ZREM', L.turns, T.entry(old, group)) end
  local head = redis.call('ZRANGE', T.line_of(L, group), 0, 0, 'WITHSCORES')
  local held = T.held(L, group)
  if not head[1] then
    if old then redis.call('ZREM', L.shares, field) end
    -- A group that neither waits nor holds any more: its turn is forgotten.
    if grouped and held <= 0 then redis.call('ZREM', L.shares, 't' .. group) end
    return
  end
  if not grouped then T.begin(L) end
  local turn = redis.call('ZSCORE', L.shares, 't' .. group)
  if not turn then
    -- A group that starts waiting: its turn is the next (after every group that waits already,
    -- or was served, before it).
    turn = redis.call('ZINCRBY', L.shares, 1, '#')
    redis.call('ZADD', L.shares, turn, 't' .. group)
  end
  local most = group ~= '' and T.most(L, T.share(head[1]))
  local score = '+inf'
  if not (most and held + T.need(L, head[1]) > most) then
    score = math.floor(tonumber(head[2]) / CLASS) * HELD_SPAN + held / T.weight(head[1])
  end
  redis.call('ZADD', L.turns, score, T.entry(turn, group))
  redis.call('ZADD', L.shares, turn, field)
  if not L.grouped then
    L.grouped = true
    if L.cap > 0 then redis.call('ZADD', L.shares, L.cap, 'cap') end
    T.keep(L.turns, L.ttl)  -- a new key: pushed on by the joins and the waiters' beats from now on
  end
end

-- Turns begin (nobody waited): the turns of an earlier spell of waiting count no more.
function T.begin(L)
  for _, name in ipairs(redis.call('ZRANGE', L.shares, 0, -1)) do
    local kind = string.sub(name, 1, 1)
    if kind == 't' or kind == '=' or kind == '#' then redis.call('ZREM', L.shares, name) end
  end
  L.grouped = true
end

-- A group got a slot: its turn is the ledger's next (it waits behind the groups served before).
function T.served(L, group)
  if not T.is_grouped(L) then return end
  redis.call('ZADD', L.shares, redis.call('ZINCRBY', L.shares, 1, '#'), 't' .. group)
end

-- The capacity in force is not the one the groups were ranked with ('cap'): rank them all again
-- (every entry is ranked with 'cap': a script that knows the capacity in force syncs first).
function T.sync(L)
  if L.synced or L.cap <= 0 or not T.is_grouped(L) then return end
  L.synced = true
  if tonumber(redis.call('ZSCORE', L.shares, 'cap') or 0) == L.cap then return end
  redis.call('ZADD', L.shares, L.cap, 'cap')
  for _, entry in ipairs(redis.call('ZRANGE', L.turns, 0, -1)) do
    T.rerank(L, string.match(entry, '|(%x*)$'))
  end
end

-- Whether any claim waits in the ledger's turn (one EXISTS of the line and turns: both, or
-- neither, also says whether a group waits; one of them is told apart by T.is_grouped).
function T.waits(L)
  local found = redis.call('EXISTS', L.line, L.turns)
  if found == 0 then L.grouped = false elseif found == 2 then L.grouped = true else L.either = true end
  return found > 0
end

-- The claim served next: its member, group, line and score; nil when none waits (a group whose
-- line expired, its waiters gone, loses its entry on the way).
function T.first(L)
  T.sync(L)
  while T.is_grouped(L) do
    local top = redis.call('ZRANGE', L.turns, 0, 0, 'WITHSCORES')
    if not top[1] then break end
    if top[2] == 'inf' then return nil end  -- every waiting group holds its maximum share
    local group = string.match(top[1], '|(%x*)$')
    local line = T.line_of(L, group)
    local head = redis.call('ZRANGE', line, 0, 0, 'WITHSCORES')
    if head[1] then return head[1], group, line, head[2] end
    redis.call('ZREM', L.turns, top[1])
    redis.call('ZREM', L.shares, '=' .. group)
  end
  local head = L.head or redis.call('ZRANGE', L.line, 0, 0, 'WITHSCORES')
  L.head = nil
  if head[1] then return head[1], '', L.line, head[2] end
  return nil
end

-- Claim `member` joins its group's line at `score` (a string: written as given); 1 when it was
-- not there before. A new line lives at least ttl / 2 more (pushed to ttl when less is left).
function T.join(L, member, score)
  local group = T.group(member)
  local line = T.line_of(L, group)
  local fresh = group ~= '' and not T.is_grouped(L)
  L.head = nil
  local added = redis.call('ZADD', line, 'NX', score, member)
  if added == 1 then
    T.keep(line, L.ttl)
    if fresh then
      -- Turns begin: the claims without a group waited first, and take turns as one more group.
      T.begin(L)
      T.rerank(L, '')
    end
    T.rerank(L, group)
    if L.grouped then
      T.keep(L.turns, L.ttl)
      T.keep(L.shares, L.ttl)
    end
  end
  return added
end

-- Claim `member` leaves its line; 1 when it was there.
function T.unjoin(L, member)
  local group = T.group(member)
  L.head = nil
  local removed = redis.call('ZREM', T.line_of(L, group), member)
  if removed == 1 then T.rerank(L, group) end
  return removed
end

-- How many claims of `member`'s group wait in its line.
function T.waiting(L, member)
  return redis.call('ZCARD', T.line_of(L, T.group(member)))
end

-- Whether a newcomer `member` needing `need` units may be admitted with `room` units free: the
-- room fits it, no claim waits before it (the first in turn, or a claim whose need the room
-- does not fit yet, keeps it), and its group stays within its maximum share.
function T.admits(L, member, need, room)
  if need > room then return false end
  if T.waits(L) then
    local first = T.first(L)
    if first and first ~= member then return false end
  end
  local group = T.group(member)
  local most = group ~= '' and T.most(L, T.share(member))
  return not most or T.held(L, group) + need <= most
end

-- Hand the ledger's room on (`room` units free): while the claim served next fits, it leaves its
-- line and holds its need, expiring at expiry() (a string), with the fence fence_of() gives it
-- (asked before anything is written for it: an error there writes nothing), and
-- tell_of(member, expiry, fence) tells it (false: nobody listens, and its hold is taken back).
-- The room left.
function T.hand_on(L, room, expiry, fence_of, tell_of)
  while room > 0 do
    local member, group, line = T.first(L)
    if not member then break end
    local need = T.need(L, member)
    if need > room then break end
    local issued = fence_of()
    L.head = nil
    redis.call('ZREM', line, member)
    local at = expiry()
    T.write(L, member, need, at)
    if tell_of(member, at, issued) then
      room = room - need
      T.served(L, group)
    else
      T.drop(L, member)
    end
    T.rerank(L, group)
  end
  return room
end

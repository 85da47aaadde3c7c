-- settle.lua: declare the ledgers of a prefix settled now (lib/epoch.lua): a
-- settling in course ends, and a missing epoch is made settled. For whoever
-- knows that no job of the prefix runs: an operator after a planned restart of
-- every worker, or after a loss of data once every holder is known to have
-- re-asserted (`dramatiq-slots settle`, Ledger.settle), a test suite that empties
-- its server. Never needed for correctness: a settling ends by itself; this only
-- shortens it.
--
-- KEYS[1]  epoch: the epoch (lib/epoch.lua)
-- ARGV     none
--
-- Returns int: integer, the ms that were left of a settling (0: none was in course).
-- Errors  SLOTS_ARG 0 count: called with other keys or arguments; nothing written

-- include: args
if #KEYS ~= 1 or #ARGV ~= 0 then return bad(0, 'count') end
-- include: epoch
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local settled = redis.call('ZSCORE', KEYS[1], 'settled')
local left = 0
if settled and tonumber(settled) > now then left = tonumber(settled) - now end
redis.call('ZADD', KEYS[1], string.format('%.0f', now), 'settled')
redis.call('ZADD', KEYS[1], 'NX', string.format('%.0f', now), 'born')
keep_epoch(KEYS[1])
return left

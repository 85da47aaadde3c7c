-- settle.lua: declare the ledgers of a prefix settled now (lib/epoch.lua): a
-- missing epoch then keeps no newcomer out. For whoever knows that no job of
-- the prefix runs: a deployment's first start on an empty Redis, a test suite,
-- an operator after a planned restart of every worker (Ledger.settle). Never
-- needed for correctness: a settling ends by itself; this only shortens it.
--
-- KEYS[1]  the epoch (lib/epoch.lua)
--
-- Returns the ms that were left of a settling (0: none was in course).
-- Returns {-1, 0} when called with other keys or arguments; nothing written.

if #KEYS ~= 1 or #ARGV ~= 0 then return {-1, 0} end
-- include: epoch
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local settled = redis.call('ZSCORE', KEYS[1], 'settled')
local left = 0
if settled and tonumber(settled) > now then left = tonumber(settled) - now end
redis.call('ZADD', KEYS[1], string.format('%.0f', now), 'settled')
keep_epoch(KEYS[1])
return left

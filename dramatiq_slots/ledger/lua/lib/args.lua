-- lib/args.lua: checking a script's arguments (inlined where a script says
-- "-- include: args"; the header format and the error reply: docs/design.md, "Scripts").
--
-- bad(j, name): the error reply 'SLOTS_ARG <j> <name>': ARGV[j], called <name> in the
-- script's header, is malformed; j = 0 and name 'count': a wrong number of KEYS or ARGV.
-- Every script checks all its arguments before its first write, so a refused call has
-- written nothing. The ledger raises the reply as LedgerArgumentError (ledger/specs.py).
--
-- integer(value, least): value as a number when it is an integer >= least, else nil.

local function bad(j, name)
  return redis.error_reply(string.format('SLOTS_ARG %d %s', j, name))
end

local function integer(value, least)
  local number = tonumber(value)
  if number and number >= least and number == math.floor(number) then return number end
  return nil
end

--[[
Forget consumers of a relay's group (shared/relaying.py): KEYS[1] an outbox stream (a board's
outbox, its period outbox, or a deleted board's parked period outbox). ARGV: the group, how long
a consumer must have been idle (ms), a consumer's name ('' for any). Each consumer of the group
(the one named, where one is) that has no entry pending and has been idle that long at least is
deleted (XGROUP DELCONSUMER). Its pending entries are looked at in the same step as the delete:
a consumer deleted with entries pending would take them with it, and nobody would read them
again, and a relay that reads between a look and a delete makes some pending. A stream or group
that is gone has no consumer to forget. Returns the number of consumers deleted.
]]
local function forget_consumers(keys, args)
  local found = redis.pcall('XINFO', 'CONSUMERS', keys[1], args[1])
  if type(found) ~= 'table' or found.err then return 0 end
  local idle, forgotten = tonumber(args[2]), 0
  for _, consumer in ipairs(found) do
    local fields = {}
    for i = 1, #consumer - 1, 2 do fields[consumer[i]] = consumer[i + 1] end
    local named = args[3] == '' or fields.name == args[3]
    if named and fields.pending == 0 and fields.idle >= idle then
      redis.call('XGROUP', 'DELCONSUMER', keys[1], args[1], fields.name)
      forgotten = forgotten + 1
    end
  end
  return forgotten
end

redis.register_function(FUNCTIONS.forget_consumers, forget_consumers)

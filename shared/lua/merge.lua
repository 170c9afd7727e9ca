--[[
The aggregator's merged views (the global boards; docs/architecture.md).

Replace entries of a merged view, keeping its hash of tie keys and distinct-score set right
(shared/ranking.py). KEYS: view, distinct, ties. ARGV: expire-at (0: never), then triples of
id, signed score and tie key (an empty score removes the id's entry).
Returns how many entries changed.
]]
local function put(keys, args)
  local v, at, changed = view_of(keys[1], keys[2], keys[3]), tonumber(args[1]), 0
  for j = 2, #args, 3 do
    local id, score, tie = args[j], args[j + 1], args[j + 2]
    local old = entry_in(v, id)
    if score == '' then
      if old then
        remove_entry(v, id, old)
        changed = changed + 1
      end
    elseif old == nil or old.signed ~= tonumber(score) or old.tie ~= tie then
      put_entry(v, id, old, tonumber(score), tie)
      changed = changed + 1
    end
  end
  expire(keys, at)
  return changed
end

redis.register_function(FUNCTIONS.put, put)

--[[
The aggregator's merged views (the global boards; docs/architecture.md).

Replace entries of a merged view, keeping its hash of records and distinct-score set right
(shared/ranking.py). KEYS: view, distinct, records. ARGV: expire-at (0: never), then fours of
id, signed score, tie key and metadata ('' for none; an empty score removes the id's entry).
Returns how many entries changed.
]]
local function put(keys, args)
  local v, at, changed = view_of(keys[1], keys[2], keys[3]), tonumber(args[1]), 0
  for j = 2, #args, 4 do
    local id, score, tie, meta = args[j], args[j + 1], args[j + 2], args[j + 3]
    local old = entry_in(v, id)
    if score == '' then
      if old then
        remove_entry(v, id, old)
        changed = changed + 1
      end
    elseif old == nil or old.signed ~= tonumber(score) or old.tie ~= tie or old.meta ~= meta then
      put_entry(v, id, old, tonumber(score), tie, meta)
      changed = changed + 1
    end
  end
  expire(keys, at)
  return changed
end

redis.register_function(FUNCTIONS.put, put)

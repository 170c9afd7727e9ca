--[[
The aggregator's merged views (the global boards; docs/architecture.md).

Replace entries of a merged view, keeping its distinct-score set right. KEYS: view, distinct.
ARGV: scale, expire-at (0: never), then pairs of member and composite ('' removes the member).
Returns how many entries changed.
]]
local function put(keys, args)
  local scale, at, changed = tonumber(args[1]), tonumber(args[2]), 0
  for j = 3, #args, 2 do
    local member, composite = args[j], args[j + 1]
    local old = redis.call('ZSCORE', keys[1], member)
    local old_signed = nil
    if old then old_signed = signed_of(old, scale) end
    if composite == '' then
      if old then
        redis.call('ZREM', keys[1], member)
        if not held(keys[1], old_signed, scale) then
          redis.call('ZREM', keys[2], fmt(old_signed))
        end
        changed = changed + 1
      end
    elseif old ~= composite and (old == false or tonumber(old) ~= tonumber(composite)) then
      put_entry(keys[1], keys[2], member, tonumber(composite), old_signed,
                signed_of(composite, scale), scale)
      changed = changed + 1
    end
  end
  expire(keys, at)
  return changed
end

redis.register_function(FUNCTIONS.put, put)

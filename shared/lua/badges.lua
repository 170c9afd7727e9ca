--[[
Award a badge exactly once (docs/api.md section 3): KEYS[1] the user's badges hash. ARGV badge,
awarded-at, channel, message. Records the badge and publishes the message in one step, so a
badge is pushed exactly when it is first recorded, however often its event is delivered.
Returns 1 if awarded now, 0 if the user had it already.
]]
local function award(keys, args)
  if redis.call('HSETNX', keys[1], args[1], args[2]) == 0 then return 0 end
  redis.call('PUBLISH', args[3], args[4])
  return 1
end

redis.register_function(FUNCTIONS.award, award)

--[[
A user's place in one view and the entries around it, read in one step (docs/api.md section 5,
the standing read). KEYS: the view, the board's display names. ARGV: user, how many entries
either side. Returns {} if the user has no score in the view;
else {its 0-based position, its composite, the view's size, the entries as member, composite,
member, composite..., their display names (nil where none)}.
]]
local function standing(keys, args)
  local user, around = args[1], tonumber(args[2])
  local position = redis.call('ZREVRANK', keys[1], user)
  if not position then return {} end
  local rows = redis.call('ZREVRANGE', keys[1], math.max(position - around, 0),
                          position + around, 'WITHSCORES')
  local members = {}
  for i = 1, #rows, 2 do members[#members + 1] = rows[i] end
  local names = redis.call('HMGET', keys[2], unpack(members))
  return {position, redis.call('ZSCORE', keys[1], user), redis.call('ZCARD', keys[1]), rows,
          names}
end

redis.register_function{function_name = FUNCTIONS.standing, callback = standing,
                        flags = {'no-writes'}}

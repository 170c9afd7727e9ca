--[[
A user's place in one view and the entries around it, read in one step (docs/api.md section 5,
the standing read). KEYS: the view, its hash of tie keys, the board's display names. ARGV: user,
how many entries either side. Returns {} if the user has no score in the view; else {its
0-based position, its signed score, the view's size, the entries as member, score, member,
score..., their display names (nil where none)}. A member is a tie key then the id
(shared/ranking.py).
]]
local function standing(keys, args)
  local user, around = args[1], tonumber(args[2])
  local tie = redis.call('HGET', keys[2], user)
  if not tie then return {} end
  local position = redis.call('ZREVRANK', keys[1], tie .. user)
  if not position then return {} end
  local rows = redis.call('ZREVRANGE', keys[1], math.max(position - around, 0),
                          position + around, 'WITHSCORES')
  local ids = {}
  for i = 1, #rows, 2 do ids[#ids + 1] = string.sub(rows[i], #tie + 1) end
  local names = redis.call('HMGET', keys[3], unpack(ids))
  return {position, redis.call('ZSCORE', keys[1], tie .. user), redis.call('ZCARD', keys[1]),
          rows, names}
end

--[[
The entries of ids in one view (the merge's and the friends scope's read). KEYS: the view, its
hash of tie keys. ARGV: ids. Returns, for each id, its tie key and its signed score (both nil
where it has none).
]]
local function entries(keys, args)
  local out = {}
  if #args == 0 then return out end
  local ties = redis.call('HMGET', keys[2], unpack(args))
  for i, id in ipairs(args) do
    local score = false
    if ties[i] then score = redis.call('ZSCORE', keys[1], ties[i] .. id) end
    out[#out + 1] = score and ties[i] or false
    out[#out + 1] = score
  end
  return out
end

redis.register_function{function_name = FUNCTIONS.standing, callback = standing,
                        flags = {'no-writes'}}
redis.register_function{function_name = FUNCTIONS.entries, callback = entries,
                        flags = {'no-writes'}}

--[[
A user's place in one view and the entries around it, read in one step (docs/api.md section 5,
the standing read). KEYS: the view, its hash of records, the board's display names. ARGV: user,
how many entries either side. Returns {} if the user has no score in the view; else {its
0-based position, its signed score, the view's size, the entries as member, score, member,
score..., their display names (nil where none), their records (shared/ranking.py)}. A member is
a tie key then the id.
]]
local function standing(keys, args)
  local user, around = args[1], tonumber(args[2])
  local rec = redis.call('HGET', keys[2], user)
  if not rec then return {} end
  local tie, score = string.match(rec, '^([^|]*)|([^|]*)|')
  local position = redis.call('ZREVRANK', keys[1], tie .. user)
  if not position then return {} end
  local rows = redis.call('ZREVRANGE', keys[1], math.max(position - around, 0),
                          position + around, 'WITHSCORES')
  local ids = {}
  for i = 1, #rows, 2 do ids[#ids + 1] = string.sub(rows[i], #tie + 1) end
  return {position, score, redis.call('ZCARD', keys[1]), rows,
          redis.call('HMGET', keys[3], unpack(ids)), redis.call('HMGET', keys[2], unpack(ids))}
end

--[[
The count behind a competition or dense rank on a board with a subscore (docs/api.md section 5):
KEYS: the view, its distinct-score set. ARGV: the style, a signed score, a subscore part
(shared/ranking.py). Returns how many entries (competition) or distinct (score, subscore) pairs
(dense) rank strictly above the pair; the pair is one that an entry of the view holds.
]]
local function above(keys, args)
  local signed, sub = tonumber(args[2]), args[3]
  if args[1] == 'dense' then
    return redis.call('ZREVRANK', keys[2], distinct_member(signed, sub)) or 0
  end
  return (above_pair(keys[1], signed, sub))
end

redis.register_function{function_name = FUNCTIONS.above, callback = above,
                        flags = {'no-writes'}}
redis.register_function{function_name = FUNCTIONS.standing, callback = standing,
                        flags = {'no-writes'}}

--[[
The users' hashes of a board that keeps no all-time period trimmed (services/aggregator/trim.py):
the names, the users' regions and the users' teams (shared/keys.py names, user_regions,
user_team) lose the fields of users that no period the board still keeps holds. The decision
and the deletion are one step, so that no write, derive step or merge comes between them.

KEYS: names, users' regions, users' team, hidden users, dirty set, merging set; then for each
period the caller gives: its global view's records (shared/keys.py ties), its regions set, then
the records of its regional views, one for each region the set held when the caller read it.
ARGV: how many periods; for each: how many regions it gave, the two parts of its dirty marks
(prefix, separator: a mark is prefix .. region .. separator .. user, shared/keys.py
dirty_member), then its regions, in the order of their keys; then the users of the chunk.

A user is kept if it is hidden (its members are out of the views, its records stay), or, in any
period given, holds a record in the global view or a regional view, or a dirty mark in the dirty
or merging set (a write accepted and not merged yet holds a regional record already; its mark
says so as well). Returns {0, users trimmed, fields deleted}; {1, 0, 0}, deleting nothing, if a
period's regions set no longer holds as many regions as given (a region new to the period, or
the set expired since the caller read it): the caller reads the regions again.
]]

-- The users of `users` whose reply is nil or 0 (HMGET, SMISMEMBER): those not held.
local function unheld(users, replies)
  local left = {}
  for i, user in ipairs(users) do
    local r = replies[i]
    if r == false or r == 0 then left[#left + 1] = user end
  end
  return left
end

-- The users of `left` with no record in the period's views and no mark in either set.
local function not_in_period(k, p, left)
  if #left == 0 then return left end
  left = unheld(left, redis.call('HMGET', p.ties, unpack(left)))
  for r, region in ipairs(p.regions) do
    if #left == 0 then return left end
    left = unheld(left, redis.call('HMGET', p.views[r], unpack(left)))
    for _, set in ipairs(k.marked) do
      if #left == 0 then return left end
      local marks = {}
      for i, user in ipairs(left) do marks[i] = p.marks .. region .. p.separator .. user end
      left = unheld(left, redis.call('SMISMEMBER', set, unpack(marks)))
    end
  end
  return left
end

-- The periods ARGV and KEYS give, from ARGV[1]; nil if a regions set holds another count. Also
-- returns the position of the first user in ARGV.
local function periods_of(keys, args)
  local periods, ai, ki = {}, 2, 7
  for n = 1, tonumber(args[1]) do
    local count = tonumber(args[ai])
    if redis.call('SCARD', keys[ki + 1]) ~= count then return nil, 0 end
    local p = {ties = keys[ki], marks = args[ai + 1], separator = args[ai + 2], regions = {},
               views = {}}
    for r = 1, count do p.regions[r], p.views[r] = args[ai + 2 + r], keys[ki + 1 + r] end
    periods[n] = p
    ai, ki = ai + 3 + count, ki + 2 + count
  end
  return periods, ai
end

local function trim_users(keys, args)
  local periods, first = periods_of(keys, args)
  if periods == nil then return {1, 0, 0} end
  -- The dirty and merging sets, where not empty (most of the time between merges they are).
  local k = {marked = {}}
  for _, set in ipairs({keys[5], keys[6]}) do
    if redis.call('SCARD', set) > 0 then k.marked[#k.marked + 1] = set end
  end
  local left = {unpack(args, first)}
  if #left == 0 then return {0, 0, 0} end
  left = unheld(left, redis.call('SMISMEMBER', keys[4], unpack(left)))
  for _, p in ipairs(periods) do left = not_in_period(k, p, left) end
  if #left == 0 then return {0, 0, 0} end
  local stamps = {}
  for i, user in ipairs(left) do stamps[i] = team_stamp(user) end
  local deleted = redis.call('HDEL', keys[1], unpack(left)) +
                  redis.call('HDEL', keys[2], unpack(left)) +
                  redis.call('HDEL', keys[3], unpack(left)) +
                  redis.call('HDEL', keys[3], unpack(stamps))
  return {0, #left, deleted}
end

redis.register_function(FUNCTIONS.trim_users, trim_users)

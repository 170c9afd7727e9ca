--[[
The hot view (docs/api.md section 8a), kept by the aggregator; its team MVPs' contributions are
live.lua's.

The hot view's events. KEYS: the board's hot event set (member '<event_id>|<user_id>|<value>',
scored by its position: occurred_at in ms plus a fraction, in 1024ths, that the member's hash
picks), then two keys per window: a hash holding, for the events inside it, 's:<user>' and
'h:<user>' (their sum, in two parts: below) and 'c:<user>' (their count), and 'at': the position
up to which events have left the window (an event at or before it is outside); and the window's
ranking, a sorted set of one member per user with events inside it, kept with the hash in the
same step.

A sum is kept as 'h:<user>' * 2^32 + 's:<user>', each part an exact integer that HINCRBY moves:
an event's value v (within ±(2^53 - 1)) adds v's remainder by 2^32, of v's sign, to the low part
and the quotient to the high part, which a value under 2^32 in size leaves alone (and absent).
A sum of one user's events in a minute may pass what one 64-bit integer holds (a thousand events
near 2^53: an HINCRBY of the whole values failed there, and the event's call with it); the parts
never do. A window of the layout before holds whole sums in its low parts, which read the same.

The fraction spreads the events of one millisecond (a batch of events stamped alike) over 1024
positions, so that a trim can stop within a millisecond and each call costs a bounded number of
events. A window whose start is moved to millisecond T is moved to the last position of T (T
plus 1023/1024): an event of T or before is outside, as before. Positions are exact as doubles
until the year 2248.

A ranking orders its users as the hot view does (shared/live_maths.py): the higher average
first, then more events, then the smaller user id. Its score is the average negated (the sum
over the count, as a double); its member is the count, as the 12 digits of 10**12 minus it,
then '|' and the user, so that members of one score sort by count, larger first, then by user
id, bytewise. Reading the top is then a range of the ranking, not a pass over every user of the
window: that pass, over a window of many users, held Redis for tens of milliseconds a tick.
]]
local HOT_SLOTS = 1024
local HOT_LIMB = 2 ^ 32
local HOT_EXACT = 2 ^ 53
local HOT_COUNT_CAP = 1e12
local HOT_COUNT_DIGITS = 12

-- (A number of 12 digits concatenates as they are: a user never has 10**11 events in a window.)
local function hot_rank_member(user, count) return (HOT_COUNT_CAP - count) .. '|' .. user end

-- The user's place in a window's ranking moved from its old count to its new one (0: none)
-- and average.
local function hot_rerank(rank, user, old_count, count, average)
  if old_count > 0 then redis.call('ZREM', rank, hot_rank_member(user, old_count)) end
  if count > 0 then
    -- A number argument goes to Redis in full (a string of 17 digits), as position() makes it.
    redis.call('ZADD', rank, 0 - average, hot_rank_member(user, count))
  end
end

-- A window's changes within one call, by user: events in (or out, negative); the count and
-- the ranking are then written once a user (hot_settle), the sums as each event comes, so that
-- they stay exact integers in Redis.
local function hot_tally() return {order = {}, n = {}} end

local function hot_count(tally, user, n)
  if tally.n[user] == nil then
    tally.order[#tally.order + 1] = user
    tally.n[user] = 0
  end
  tally.n[user] = tally.n[user] + n
end

-- A user's sum in a window moved by `value` (negative: an event out), in its two parts.
local function hot_add_value(window, user, value)
  local low = math.fmod(value, HOT_LIMB)
  local high = (value - low) / HOT_LIMB
  redis.call('HINCRBY', window, 's:' .. user, fmt(low)) -- fmt(): never '-0'
  if high ~= 0 then redis.call('HINCRBY', window, 'h:' .. user, fmt(high)) end
end

-- The floor of a / b and its remainder (0 to b - 1), for integers whose quotient as a double
-- may round across an integer.
local function floor_div(a, b)
  local q = math.floor(a / b)
  local r = a - q * b
  if r < 0 then q, r = q - 1, r + b elseif r >= b then q, r = q + 1, r - b end
  return q, r
end

-- The average of a sum kept in two parts (strings, or false for an absent high part) over
-- `count`: the double sum / count where the sum is exact as a double, as it was before the sum
-- was kept in parts; past 2^53, the whole part of the average exactly and its fraction added.
local function hot_average(low, high, count)
  low, high = tonumber(low), tonumber(high or 0)
  local sum = high * HOT_LIMB + low
  if sum >= -HOT_EXACT and sum <= HOT_EXACT then return sum / count end
  local hq, hr = floor_div(high, count)
  local mq, mr = floor_div(hr * HOT_LIMB + low, count)
  return (hq * HOT_LIMB + mq) + mr / count
end

local function hot_settle(window, rank, tally)
  for _, user in ipairs(tally.order) do
    local n = tally.n[user]
    local count = redis.call('HINCRBY', window, 'c:' .. user, n)
    if count <= 0 then
      redis.call('HDEL', window, 'c:' .. user, 's:' .. user, 'h:' .. user)
      hot_rerank(rank, user, count - n, 0, 0)
    else
      local parts = redis.call('HMGET', window, 's:' .. user, 'h:' .. user)
      hot_rerank(rank, user, count - n, count, hot_average(parts[1], parts[2], count))
    end
  end
end

-- A window kept before rankings were (its hash holds users, it has no ranking) gets its
-- ranking from its hash, once.
local function hot_ranked(window, rank)
  if redis.call('EXISTS', rank) == 1 or redis.call('HLEN', window) <= 1 then return end
  local fields, parts, members = redis.call('HGETALL', window), {s = {}, h = {}}, {}
  for j = 1, #fields, 2 do
    local part = parts[string.match(fields[j], '^([sh]):')]
    if part then part[string.sub(fields[j], 3)] = fields[j + 1] end
  end
  for j = 1, #fields, 2 do
    local count = tonumber(fields[j + 1])
    if string.sub(fields[j], 1, 2) == 'c:' and count > 0 then
      local user = string.sub(fields[j], 3)
      members[#members + 1] = 0 - hot_average(parts.s[user] or 0, parts.h[user], count)
      members[#members + 1] = hot_rank_member(user, count)
    end
  end
  batched('ZADD', rank, members)
end

-- An event's position in the event set: its millisecond, and a fraction its member picks.
-- Positions are not integers: they go to Redis with every digit (fmt() writes integers).
local function position(at) return string.format('%.17g', at) end

local function hot_position(member, ms)
  return ms + tonumber(string.sub(redis.sha1hex(member), 1, 4), 16) % HOT_SLOTS / HOT_SLOTS
end

--[[
hot_add ARGV: ttl ms, then four per event: member, occurred_at ms, user, value. Adds each event
to the set and to each window it is inside, and its user's place in the window's ranking, once:
a redelivery finds its member already there. Returns how many were added now.
]]
local function hot_add(keys, args)
  local ttl, added, starts, tallies = tonumber(args[1]), 0, {}, {}
  for i = 2, #keys, 2 do
    hot_ranked(keys[i], keys[i + 1])
    starts[i], tallies[i] = tonumber(redis.call('HGET', keys[i], 'at') or 0), hot_tally()
  end
  for j = 2, #args, 4 do
    local at, user = hot_position(args[j], tonumber(args[j + 1])), args[j + 2]
    if redis.call('ZADD', keys[1], 'NX', position(at), args[j]) == 1 then
      added = added + 1
      for i = 2, #keys, 2 do
        if at > starts[i] then
          hot_add_value(keys[i], user, tonumber(args[j + 3]))
          hot_count(tallies[i], user, 1)
        end
      end
    end
  end
  for i = 2, #keys, 2 do hot_settle(keys[i], keys[i + 1], tallies[i]) end
  if added > 0 then
    for i = 1, #keys do redis.call('PEXPIRE', keys[i], ttl) end
  end
  return added
end

-- One event out of a window: its user's sum, and its count in the call's tally.
local function hot_leave(window, tally, member)
  local user, value = string.match(member, '^[^|]*|([^|]*)|(-?%d+)$')
  hot_add_value(window, user, 0 - tonumber(value))
  hot_count(tally, user, -1)
end

-- A window's start moved towards the last position of millisecond `start` (never back:
-- aggregators with different clocks may call), taking out of it the events it leaves behind, at
-- most about `step` of them; returns whether it got there. Events of one position are taken out
-- together, so that the start never falls between two of them.
local function hot_advance(events, window, rank, start, step)
  local old = tonumber(redis.call('HGET', window, 'at') or 0)
  local target = start + (HOT_SLOTS - 1) / HOT_SLOTS
  if target <= old then return true end
  local leaving = redis.call('ZRANGEBYSCORE', events, '(' .. position(old), position(target),
                             'WITHSCORES', 'LIMIT', 0, step)
  local upto = target
  if #leaving == 2 * step then -- more may follow: up to the position before the last taken
    local last = tonumber(leaving[#leaving])
    upto = last - 1 / HOT_SLOTS
    if upto <= old then -- all of them at one position: that one whole
      upto = last
      leaving = redis.call('ZRANGEBYSCORE', events, position(last), position(last), 'WITHSCORES')
    end
  end
  local tally = hot_tally()
  for j = 1, #leaving, 2 do
    if tonumber(leaving[j + 1]) <= upto then hot_leave(window, tally, leaving[j]) end
  end
  hot_settle(window, rank, tally)
  redis.call('HSET', window, 'at', position(upto))
  return upto == target
end

-- The first `n` users of a window's ranking but those of the hidden set: member, score, ...
local function hot_top(rank, hidden, n)
  local top, from, check = {}, 0, redis.call('EXISTS', hidden) == 1
  while #top < 2 * n do
    local page = redis.call('ZRANGE', rank, from, from + n - 1, 'WITHSCORES')
    if #page == 0 then break end
    for j = 1, #page, 2 do
      local user = string.sub(page[j], HOT_COUNT_DIGITS + 2)
      if not check or redis.call('SISMEMBER', hidden, user) == 0 then
        top[#top + 1], top[#top + 2] = page[j], page[j + 1]
        if #top == 2 * n then break end
      end
    end
    from = from + n
  end
  return top
end

--[[
hot_trim KEYS: as hot_add's, then the board's hidden users. ARGV: ttl ms, step (the events a
call takes out of a window, at most about), n (the top's length), then each window's new start
in ms. Moves each window's start forward, taking out of its sums and ranking the events it
leaves behind, then drops from the set what every window has left. A call costs at most about
`step` events a window: while a window has not reached its new start, it returns {0} and the
caller calls again; once every one has, {1, top of the first window, top of the second, ...},
each the first `n` users of its ranking who are not hidden, as member, score, member, score...
]]
local function hot_trim(keys, args)
  local ttl, step, n = tonumber(args[1]), tonumber(args[2]), tonumber(args[3])
  local hidden, oldest, caught_up = keys[#keys], nil, true
  for i = 2, #keys - 1, 2 do
    hot_ranked(keys[i], keys[i + 1])
    if not hot_advance(keys[1], keys[i], keys[i + 1], tonumber(args[3 + i / 2]), step) then
      caught_up = false
    end
    local reached = tonumber(redis.call('HGET', keys[i], 'at') or 0)
    if oldest == nil or reached < oldest then oldest = reached end
  end
  redis.call('ZREMRANGEBYSCORE', keys[1], '-inf', position(oldest))
  for i = 1, #keys - 1 do redis.call('PEXPIRE', keys[i], ttl) end
  if not caught_up then return {0} end
  local reply = {1}
  for i = 2, #keys - 1, 2 do reply[#reply + 1] = hot_top(keys[i + 1], hidden, n) end
  return reply
end

redis.register_function(FUNCTIONS.hot_add, hot_add)
redis.register_function(FUNCTIONS.hot_trim, hot_trim)

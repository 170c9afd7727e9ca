--[[
The live views (docs/api.md section 8a), kept by the aggregator.

The hot view's events. KEYS: the board's hot event set (member '<event_id>|<user_id>|<value>',
scored by its position: occurred_at in ms plus a fraction, in 1024ths, that the member's hash
picks), then two keys per window: a hash holding, for the events inside it, 's:<user>' (their
sum) and 'c:<user>' (their count), and 'at': the position up to which events have left the
window (an event at or before it is outside); and the window's ranking, a sorted set of one
member per user with events inside it, kept with the hash in the same step.

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
local HOT_COUNT_CAP = 1e12
local HOT_COUNT_DIGITS = 12

-- (A number of 12 digits concatenates as they are: a user never has 10**11 events in a window.)
local function hot_rank_member(user, count) return (HOT_COUNT_CAP - count) .. '|' .. user end

-- The user's place in a window's ranking moved from its old count to its new one (0: none)
-- and sum.
local function hot_rerank(rank, user, old_count, count, sum)
  if old_count > 0 then redis.call('ZREM', rank, hot_rank_member(user, old_count)) end
  if count > 0 then
    -- A number argument goes to Redis in full (a string of 17 digits), as position() makes it.
    redis.call('ZADD', rank, 0 - sum / count, hot_rank_member(user, count))
  end
end

-- A window's changes within one call, by user: events in (or out, negative) and the sum after
-- the last; the count and the ranking are then written once a user (hot_settle), the sums as
-- each event comes, so that they stay exact integers in Redis.
local function hot_tally() return {order = {}, n = {}, sum = {}} end

local function hot_count(tally, user, sum, n)
  if tally.n[user] == nil then
    tally.order[#tally.order + 1] = user
    tally.n[user] = 0
  end
  tally.n[user], tally.sum[user] = tally.n[user] + n, sum
end

local function hot_settle(window, rank, tally)
  for _, user in ipairs(tally.order) do
    local n = tally.n[user]
    local count = redis.call('HINCRBY', window, 'c:' .. user, n)
    if count <= 0 then
      redis.call('HDEL', window, 'c:' .. user, 's:' .. user)
      hot_rerank(rank, user, count - n, 0, 0)
    else
      hot_rerank(rank, user, count - n, count, tally.sum[user])
    end
  end
end

-- A window kept before rankings were (its hash holds users, it has no ranking) gets its
-- ranking from its hash, once.
local function hot_ranked(window, rank)
  if redis.call('EXISTS', rank) == 1 or redis.call('HLEN', window) <= 1 then return end
  local fields, sums, members = redis.call('HGETALL', window), {}, {}
  for j = 1, #fields, 2 do
    if string.sub(fields[j], 1, 2) == 's:' then sums[string.sub(fields[j], 3)] = fields[j + 1] end
  end
  for j = 1, #fields, 2 do
    local count = tonumber(fields[j + 1])
    if string.sub(fields[j], 1, 2) == 'c:' and count > 0 then
      local user = string.sub(fields[j], 3)
      members[#members + 1] = 0 - tonumber(sums[user] or 0) / count
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
          hot_count(tallies[i], user, redis.call('HINCRBY', keys[i], 's:' .. user, args[j + 3]), 1)
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
  local sum = redis.call('HINCRBY', window, 's:' .. user, 0 - tonumber(value)) -- never '-0'
  hot_count(tally, user, sum, -1)
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

--[[
A consumer's mark that it handled an event (docs/architecture.md, "Idempotency"): its bit in the
marks byte that starts the event's record (write.lua), so that an event's idempotency answer
and its consumers' marks share one key. Each call gets three keys an event: its record (named by
its board, user and id); the record of the layout before, named by the board and id alone,
which holds the marks of an event accepted before ids were scoped to users while it lasts; and
the seen key of the layout before that, which such a record without a marks byte (it starts
with a hex digit) still uses until it expires. A mark keeps the record at least `ttl` seconds
more, so that a redelivery within that time is known, however short the idempotency records'
TTL; an event with no record (its answer expired) gets a record of marks alone, its
derive-pending bit set: whether the derive step applied the event is not known any more, and
it applies an event with no record too (derive.lua).
]]
local SEEN_BITS = {notifier = 6, aggregator = 7}  -- SETBIT offsets in the marks byte '@' (0x40)
-- The derive-pending bit (derive.lua): set by the write ('D', 0x44), cleared once the
-- aggregator applied the event's derived views. Marks bytes are '@' to 'G' (0x40 to 0x47); a
-- record of the layout before starts with a lowercase hex digit.
local PENDING_BIT = 5

local function marks_of(record)
  local first = redis.call('GETRANGE', record, 0, 0)
  if first == '' then return nil end
  return string.byte(first)
end

local function is_marks(byte) return byte >= 64 and byte < 72 end

local function mask_of(consumer) return 2 ^ (7 - SEEN_BITS[consumer]) end

-- The record that holds an event's marks, and its marks byte (nil: the event has no record):
-- its own; or, while it has none, the one of the layout before under its id alone (an event
-- accepted before the upgrade has only that one). An event accepted since has its own record
-- from its write on, so it takes the other only once its own expired, beyond the window in
-- which a redelivery is known. No record is empty, so one GETRANGE tells whether the event's
-- own is there and reads its first byte.
local function record_of_event(record, legacy)
  local first = redis.call('GETRANGE', record, 0, 0)
  if first ~= '' then return record, string.byte(first) end
  first = redis.call('GETRANGE', legacy, 0, 0)
  if first ~= '' then return legacy, string.byte(first) end
  return record, nil
end

-- Whether the consumer marked the event: its record key, the record of the layout before, the
-- old seen key, the consumer.
local function was_seen(record, legacy, old, consumer)
  local _, marks = record_of_event(record, legacy)
  if marks == nil then return false end
  if not is_marks(marks) then return redis.call('EXISTS', old) == 1 end
  return bit.band(marks, mask_of(consumer)) ~= 0
end

-- Mark the event handled by the consumer (keys as was_seen's); returns whether it was marked
-- already.
local function mark_seen(record, legacy, old, consumer, ttl)
  local marks, mask
  record, marks = record_of_event(record, legacy)
  mask = mask_of(consumer)
  if marks == nil then
    redis.call('SET', record, string.char(64 + mask + 2 ^ (7 - PENDING_BIT)), 'EX', ttl)
    return false
  end
  if not is_marks(marks) then return not redis.call('SET', old, '1', 'NX', 'EX', ttl) end
  if bit.band(marks, mask) ~= 0 then return true end
  redis.call('SETBIT', record, SEEN_BITS[consumer], 1)
  redis.call('EXPIRE', record, ttl, 'GT')
  return false
end

-- seen: KEYS three per event (record, record of the layout before, old seen key), ARGV the
-- consumer; 1 or 0 for each event.
local function seen(keys, args)
  local out = {}
  for i = 1, #keys, 3 do
    out[#out + 1] = was_seen(keys[i], keys[i + 1], keys[i + 2], args[1]) and 1 or 0
  end
  return out
end

-- mark_seen: KEYS as seen's, ARGV the consumer and the ttl in seconds.
local function mark(keys, args)
  for i = 1, #keys, 3 do
    mark_seen(keys[i], keys[i + 1], keys[i + 2], args[1], tonumber(args[2]))
  end
  return #keys / 3
end

--[[
Count a batch of one board's team events toward their members' team contributions in every
period, each event exactly once (the MVP view). KEYS: each event's three seen keys (as seen's),
then the views: two keys a period of each group of events that share a team and periods (the
team's member contributions, a zset; the period's user -> "<accepted ms>|<team>" hash).
ARGV: seen ttl, event count, group count; then five an event: value, user, accepted at (ms),
team, its group (1-based); then each group: the index in KEYS of its first view key, its period
count, and each period's expire-at (0: never).
The user's team in a period is the one its latest accepted event named (of equal times, the
later in the batch). The events a call counts are summed before they are written: one ZINCRBY
a member and team, one HGET (and HSET) a user and period, one EXPIREAT a key, however many of
the batch's events name them. Returns how many events were counted now (the others had been
counted before, or came twice in the batch).
]]
local CONTRIBUTE_EVENT_ARGS = 5

local function contribution_groups(keys, args, first_arg)
  local groups, a = {}, first_arg
  for g = 1, tonumber(args[3]) do
    local key, periods, views = tonumber(args[a]), tonumber(args[a + 1]), {}
    for i = 1, periods do
      views[i] = {members = keys[key + 2 * i - 2], teams = keys[key + 2 * i - 1],
                  at = tonumber(args[a + 1 + i])}
    end
    groups[g] = views
    a = a + 2 + periods
  end
  return groups
end

-- What a batch does to one key, by user: `users` in the order first met, `by[user]` the value.
local function per_key(t, order, key)
  local found = t[key]
  if found == nil then
    found = {users = {}, by = {}}
    t[key] = found
    order[#order + 1] = key
  end
  return found
end

local function per_user(found, user)
  if found.by[user] == nil then found.users[#found.users + 1] = user end
  return found.by[user]
end

local function contribute(keys, args)
  local ttl, n = tonumber(args[1]), tonumber(args[2])
  local groups = contribution_groups(keys, args, 4 + CONTRIBUTE_EVENT_ARGS * n)
  local sums, sum_keys, latest, latest_keys, expiries = {}, {}, {}, {}, {}
  local counted = 0
  for e = 1, n do
    local s, a = 3 * (e - 1), 4 + CONTRIBUTE_EVENT_ARGS * (e - 1)
    if not mark_seen(keys[s + 1], keys[s + 2], keys[s + 3], 'aggregator', ttl) then
      counted = counted + 1
      local value, user, accepted = tonumber(args[a]), args[a + 1], args[a + 2]
      local team, ms = args[a + 3], tonumber(accepted)
      for _, v in ipairs(groups[tonumber(args[a + 4])]) do
        local sum = per_key(sums, sum_keys, v.members)
        sum.by[user] = (per_user(sum, user) or 0) + value
        local last = per_key(latest, latest_keys, v.teams)
        local before = per_user(last, user)
        if before == nil or before.ms <= ms then
          last.by[user] = {ms = ms, value = accepted .. '|' .. team}
        end
        expiries[v.members], expiries[v.teams] = v.at, v.at
      end
    end
  end
  for _, key in ipairs(sum_keys) do
    local sum = sums[key]
    for _, user in ipairs(sum.users) do redis.call('ZINCRBY', key, fmt(sum.by[user]), user) end
    expire({key}, expiries[key])
  end
  for _, key in ipairs(latest_keys) do
    local last = latest[key]
    for _, user in ipairs(last.users) do
      local stored, mine = redis.call('HGET', key, user), last.by[user]
      if not stored or tonumber(string.match(stored, '^(%d+)|')) <= mine.ms then
        redis.call('HSET', key, user, mine.value)
      end
    end
    expire({key}, expiries[key])
  end
  return counted
end

redis.register_function(FUNCTIONS.hot_add, hot_add)
redis.register_function(FUNCTIONS.hot_trim, hot_trim)
redis.register_function(FUNCTIONS.contribute, contribute)
redis.register_function{function_name = FUNCTIONS.seen, callback = seen, flags = {'no-writes'}}
redis.register_function(FUNCTIONS.mark_seen, mark)

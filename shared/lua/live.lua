--[[
The live views (docs/api.md section 8a), kept by the aggregator: the consumers' seen marks of an
event, and the team MVPs' contributions (the hot view's events are hot.lua's).
]]
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
later in the batch). The events a call counts are summed before they are written: one ZMSCORE
a team, one ZADD a member and team whose sum changed, one HGET (and HSET) a user and period, one EXPIREAT a key, however many of
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

-- A member's contribution to its team, as the team's total (derive.lua sum_teams()), is held
-- within the exact scores: an event that would take it past ±(2^53 - 1) is left out, and the
-- contribution stays at its last exact sum (a ZINCRBY's double lost the sum's last digits there).
-- sum.by[user] is the list of the batch's values for the user, in order.
local CONTRIBUTION_MAX = 9007199254740991

local function add_contributions(key, sum)
  local stored = redis.call('ZMSCORE', key, unpack(sum.users))
  for u, user in ipairs(sum.users) do
    local before = stored[u] and tonumber(stored[u])
    local total = before or 0
    for _, value in ipairs(sum.by[user]) do
      local next_total = total + value
      -- (or nearer the range: a sum a ZINCRBY left past it comes back by the events that may)
      if math.abs(next_total) <= CONTRIBUTION_MAX or math.abs(next_total) < math.abs(total) then
        total = next_total
      end
    end
    if total ~= before then redis.call('ZADD', key, fmt(total), user) end
  end
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
        local values = per_user(sum, user) or {}
        values[#values + 1] = value
        sum.by[user] = values
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
    add_contributions(key, sums[key])
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

redis.register_function(FUNCTIONS.contribute, contribute)
redis.register_function{function_name = FUNCTIONS.seen, callback = seen, flags = {'no-writes'}}
redis.register_function(FUNCTIONS.mark_seen, mark)

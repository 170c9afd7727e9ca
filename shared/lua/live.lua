--[[
The live views (docs/api.md section 8a), kept by the aggregator.

The hot view's events. KEYS: the board's hot event set (member '<event_id>|<user_id>|<value>',
score occurred_at in ms), then one hash per window holding, for the events inside it,
's:<user>' (their sum) and 'c:<user>' (their count), and 'at': the window's start in ms (an
event at or before it is outside).

hot_add ARGV: ttl ms, then four per event: member, occurred_at ms, user, value. Adds each event
to the set and to each window it is inside, once: a redelivery finds its member already there.
Returns how many were added now.
]]
local function hot_add(keys, args)
  local ttl, added, starts = tonumber(args[1]), 0, {}
  for i = 2, #keys do starts[i] = tonumber(redis.call('HGET', keys[i], 'at') or 0) end
  for j = 2, #args, 4 do
    local at, user = tonumber(args[j + 1]), args[j + 2]
    if redis.call('ZADD', keys[1], 'NX', at, args[j]) == 1 then
      added = added + 1
      for i = 2, #keys do
        if at > starts[i] then
          redis.call('HINCRBY', keys[i], 's:' .. user, args[j + 3])
          redis.call('HINCRBY', keys[i], 'c:' .. user, 1)
        end
      end
    end
  end
  if added > 0 then
    for i = 1, #keys do redis.call('PEXPIRE', keys[i], ttl) end
  end
  return added
end

--[[
hot_trim ARGV: ttl ms, then each window's new start in ms. Moves each window's start forward
(never back: aggregators with different clocks may call it), taking out of its sums the events
it leaves behind, then drops from the set what every window has left. Each call costs as much as
the events that left since the last one.
]]
local function hot_trim(keys, args)
  local ttl, oldest = tonumber(args[1]), nil
  for i = 2, #keys do
    local start = tonumber(args[i])
    local old = tonumber(redis.call('HGET', keys[i], 'at') or 0)
    if start > old then
      for _, member in ipairs(redis.call('ZRANGEBYSCORE', keys[1], '(' .. old, start)) do
        local user, value = string.match(member, '^[^|]*|([^|]*)|(-?%d+)$')
        if redis.call('HINCRBY', keys[i], 'c:' .. user, -1) <= 0 then
          redis.call('HDEL', keys[i], 'c:' .. user, 's:' .. user)
        else
          redis.call('HINCRBY', keys[i], 's:' .. user, 0 - tonumber(value))  -- never '-0'
        end
      end
      redis.call('HSET', keys[i], 'at', start)
    else
      start = old
    end
    if oldest == nil or start < oldest then oldest = start end
  end
  redis.call('ZREMRANGEBYSCORE', keys[1], '-inf', oldest)
  for i = 1, #keys do redis.call('PEXPIRE', keys[i], ttl) end
  return 0
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
TTL; an event with no record (its answer expired) gets a record of marks alone.
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

-- The record that holds an event's marks: its own; or, while it has none, the one of the layout
-- before under its id alone (an event accepted before the upgrade has only that one). An event
-- accepted since has its own record from its write on, so it takes the other only once its own
-- expired, beyond the window in which a redelivery is known.
local function record_of_event(record, legacy)
  if redis.call('EXISTS', record) == 0 and redis.call('EXISTS', legacy) == 1 then return legacy end
  return record
end

-- Whether the consumer marked the event: its record key, the record of the layout before, the
-- old seen key, the consumer.
local function was_seen(record, legacy, old, consumer)
  record = record_of_event(record, legacy)
  local marks = marks_of(record)
  if marks == nil then return false end
  if not is_marks(marks) then return redis.call('EXISTS', old) == 1 end
  return bit.band(marks, mask_of(consumer)) ~= 0
end

-- Mark the event handled by the consumer (keys as was_seen's); returns whether it was marked
-- already.
local function mark_seen(record, legacy, old, consumer, ttl)
  record = record_of_event(record, legacy)
  local marks, mask = marks_of(record), mask_of(consumer)
  if marks == nil then
    redis.call('SET', record, string.char(64 + mask), 'EX', ttl)
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
Count one event toward its member's team contribution in every period, exactly once (the MVP
view). KEYS: the event's three seen keys (as seen's), then two per period: the
team's member contributions (zset), the period's user -> "<accepted ms>|<team>" hash.
ARGV: seen ttl, value, user, team, accepted at (ms), then per period its expire-at (0: never).
The user's team in a period is the one its latest accepted event named. Returns 1 if counted
now, 0 if the event had been counted before.
]]
local function contribute(keys, args)
  if mark_seen(keys[1], keys[2], keys[3], 'aggregator', tonumber(args[1])) then return 0 end
  local value, user, team, accepted = tonumber(args[2]), args[3], args[4], tonumber(args[5])
  for i = 1, (#keys - 3) / 2 do
    local members, teams, at = keys[2 * i + 2], keys[2 * i + 3], tonumber(args[5 + i])
    redis.call('ZINCRBY', members, value, user)
    local latest = redis.call('HGET', teams, user)
    if not latest or tonumber(string.match(latest, '^(%d+)|')) <= accepted then
      redis.call('HSET', teams, user, args[5] .. '|' .. team)
    end
    expire({members, teams}, at)
  end
  return 1
end

redis.register_function(FUNCTIONS.hot_add, hot_add)
redis.register_function(FUNCTIONS.hot_trim, hot_trim)
redis.register_function(FUNCTIONS.contribute, contribute)
redis.register_function{function_name = FUNCTIONS.seen, callback = seen, flags = {'no-writes'}}
redis.register_function(FUNCTIONS.mark_seen, mark)

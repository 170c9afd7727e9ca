--[[
Erase a user from one board's keys (docs/api.md section 8b, services/api/eraser.py): the
entries of every view the caller names, with their records and distinct-score pairs (in the
view's distinct set and in the one being built, each pair once nobody else holds it); the
user's name, team, regions, badges and rate bucket; its events in the feed and in the hot
view's event set and windows; its MVP contributions; and the newest event key, if it names the
user (a rebuild would otherwise wait for an event history never stores). The HyperLogLog of a
period's players and the event counters cannot be edited and name nobody: they stay.

Each view the user left is marked dirty (its mark given by the caller), so that the merge
recomputes the user's global entry (none now) and pushes the views whose top 10 changed; each
period whose contributions changed is marked for the MVP view.

KEYS: names, user team, feed, badges, the user's regions set (the layout before; the users'
      regions hash is among the hashes below), hot events, newest event, the user's rate
      bucket, dirty set, MVP dirty set; then four per view (the view, its distinct-score set,
      the distinct set being built, its hash of records); then the hashes holding the user as a field (HDEL); then two per
      hot view window: its hash ("s:<user>", "h:<user>", "c:<user>") and its ranking
      (hot.lua); then the sorted sets holding the user as a member (ZREM).
ARGV: user, views, hashes, windows, sorted sets; then each view's dirty mark ('' none); then
      how many MVP marks, and the marks.
Returns the number of view entries removed.
]]
local function erase_user(keys, args)
  local user = args[1]
  local nv, nh, nw, nz = tonumber(args[2]), tonumber(args[3]), tonumber(args[4]), tonumber(args[5])
  local removed, ki, ai = 0, 11, 6
  for _ = 1, nv do
    local v = view_of(keys[ki], keys[ki + 1], keys[ki + 3])
    local old = entry_in(v, user)
    if old ~= nil then
      remove_entry(v, user, old)
      -- A set being built (dense.lua) may hold the pair already: its walk does not come back.
      if not held(v.view, old.signed, old.sub) then
        redis.call('ZREM', keys[ki + 2], distinct_member(old.signed, old.sub))
      end
      removed = removed + 1
      if args[ai] ~= '' then redis.call('SADD', keys[9], args[ai]) end
    end
    ki, ai = ki + 4, ai + 1
  end
  for _ = 1, nh do redis.call('HDEL', keys[ki], user); ki = ki + 1 end
  for _ = 1, nw do
    local count = tonumber(redis.call('HGET', keys[ki], 'c:' .. user) or 0)
    redis.call('HDEL', keys[ki], 's:' .. user, 'h:' .. user, 'c:' .. user)
    if count > 0 then redis.call('ZREM', keys[ki + 1], hot_rank_member(user, count)) end
    ki = ki + 2
  end
  for _ = 1, nz do redis.call('ZREM', keys[ki], user); ki = ki + 1 end
  -- In calls of 1000: a board may keep thousands of periods, past what unpack() can return.
  local marks = tonumber(args[ai])
  for i = ai + 1, ai + marks, 1000 do
    redis.call('SADD', keys[10], unpack(args, i, math.min(i + 999, ai + marks)))
  end

  redis.call('HDEL', keys[1], user)
  redis.call('HDEL', keys[2], user, team_stamp(user))
  redis.call('DEL', keys[4], keys[5], keys[8])
  -- The feed: rewritten without the user's entries, in the same order (newest first).
  local feed = redis.call('LRANGE', keys[3], 0, -1)
  local kept = {}
  for _, entry in ipairs(feed) do
    if cjson.decode(entry).user_id ~= user then kept[#kept + 1] = entry end
  end
  if #kept < #feed then
    redis.call('DEL', keys[3])
    for i = 1, #kept, 1000 do
      redis.call('RPUSH', keys[3], unpack(kept, i, math.min(i + 999, #kept)))
    end
  end
  -- The hot view's events: "<event_id>|<user_id>|<value>", neither id holding a '|'.
  local needle, gone = '|' .. user .. '|', {}
  for _, member in ipairs(redis.call('ZRANGE', keys[6], 0, -1)) do
    if string.find(member, needle, 1, true) then gone[#gone + 1] = member end
  end
  for i = 1, #gone, 1000 do
    redis.call('ZREM', keys[6], unpack(gone, i, math.min(i + 999, #gone)))
  end
  -- The newest event, "<event_id>:<user_id>" (an event id holds no ':').
  local newest = redis.call('GET', keys[7])
  if newest and string.sub(newest, (string.find(newest, ':', 1, true) or #newest) + 1) == user then
    redis.call('DEL', keys[7])
  end
  return removed
end

redis.register_function(FUNCTIONS.erase_user, erase_user)

-- Take count from an event counter: one that does not exist stays so, none goes below 0.
local function take(key, count)
  if redis.call('EXISTS', key) == 1 and redis.call('DECRBY', key, count) < 0 then
    redis.call('SET', key, 0, 'KEEPTTL')
  end
end

--[[
Take erased events out of a board's event counters (``{P:B}:events:<period>:<period_id>``):
KEYS the counters, ARGV how many to take from each. A counter that does not exist stays so (its
period has expired, or was never counted); none goes below 0. Taking too many is the safe side:
a rebuild refuses a board whose live counter is above the count the history database gives.
]]
local function uncount(keys, args)
  for i, key in ipairs(keys) do take(key, args[i]) end
  return #keys
end

redis.register_function(FUNCTIONS.uncount, uncount)

--[[
Take erased events out of a board's event counters once each, and only those counted: the
derive step counts an event when it clears its record's derive-pending bit (derive.lua), so an
event whose record has the bit clear is taken out of its counters, and its bit set again in the
same step (counted no more: a delivery again takes nothing). An event whose record has the bit
set (never derived: the aggregator leaves erased events out), or has no record, takes nothing.
KEYS: the counters, then each event's record. ARGV: how many counters; '1' to delete the records
too (the erasure's pass, whose records name the user) or '0'; then per event how many counters
it counts in, and their numbers (1-based). Returns how many events were taken out.
]]
local function uncount_events(keys, args)
  local ai, taken = 3, 0
  for ri = tonumber(args[1]) + 1, #keys do
    local record, n = keys[ri], tonumber(args[ai])
    local marks = marks_of(record)
    if marks ~= nil and is_marks(marks) and not pending(marks) then
      for j = 1, n do take(keys[tonumber(args[ai + j])], 1) end
      redis.call('SETBIT', record, PENDING_BIT, 1)
      taken = taken + 1
    end
    if args[2] == '1' then redis.call('DEL', record) end
    ai = ai + 1 + n
  end
  return taken
end

redis.register_function(FUNCTIONS.uncount_events, uncount_events)

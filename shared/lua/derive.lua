--[[
The views derived from accepted events (docs/architecture.md, "The aggregator"): the feed, the
user's regions and latest team, and per period the team boards (incr boards: each team's sum
of its members' values), the regions that have scores, the players (HyperLogLog) and the count
of accepted events; and the distinct-score sets of the regional boards that dense reads asked
for (sync_pairs() below). The aggregator applies them from the event
stream, one call per board and batch; the rebuild's replay (rebuild.lua) applies them to every
event it replays, through the same derive_events(), so that a rebuilt board equals the live
one.

Once per event: the write leaves the event's record with its derive-pending bit set
(write.lua, live.lua's PENDING_BIT); an event is applied while its bit is set, and the bit is
cleared in the same atomic step, so that a redelivered batch derives nothing twice. A record
without the bit (written by the write of the layout before, which applied these views itself)
derives nothing. An event with no record at all (it expired: the event reached the derive step
more than the idempotency TTL after it was accepted, the broker or the aggregator away that
long) is applied too, and gets a record of marks alone without the bit, kept DERIVED_MARK_TTL
seconds (as the consumers' seen marks are): nothing accepted is lost from these views. Clearing
the bit keeps any record that long at least (clear_pending()), so an event derives twice only if
it is delivered again more than DERIVED_MARK_TTL seconds after its derive step (as a consumer's
mark made for an event without a record sets the bit: live.lua's mark_seen()). The sets, the
HyperLogLog, the team hash and the users' regions are idempotent by nature; the counter, the
team sums and the feed are not, and the bit guards them.
]]
local DERIVED_MARK_TTL = 86400

-- Whether an event's record, by its first byte (record_of_event() of live.lua; nil: none),
-- still waits for its derived views.
local function pending(marks)
  return marks == nil or (is_marks(marks) and bit.band(marks, 2 ^ (7 - PENDING_BIT)) ~= 0)
end

-- Note the event's derived views applied (its record and marks byte as pending() took them),
-- and keep the record DERIVED_MARK_TTL seconds more at least (as a consumer's mark does,
-- live.lua's mark_seen()): the cleared bit is the only guard against a redelivery, and the
-- record would otherwise expire with its answer, however short the idempotency TTL. A record
-- kept longer (a longer TTL, a later mark) keeps its expiry (GT).
local function clear_pending(record, marks)
  if marks == nil then
    redis.call('SET', record, '@', 'EX', DERIVED_MARK_TTL)
  else
    redis.call('SETBIT', record, PENDING_BIT, 0)
    redis.call('EXPIRE', record, DERIVED_MARK_TTL, 'GT')
  end
end

-- Each period's team sums of a batch, one entry per (team board, team): the entry before
-- the batch, the running signed score, and the tie key it is reached at. Events apply in turn,
-- as the write applied them: an incr event adds its value to its team in every period. A sum is
-- reached when the last event it counts happened, as a user's total is (write.lua new_score()):
-- a late event adds its value but leaves the later reach time, so that the order events come in
-- does not decide ties (an event of 0 may move the reach time only). An event that would take
-- the team beyond the exact scores (±max) is left out of that team's sum, which stays at its
-- last exact total; it is counted in `refused`.
local function sum_teams(b, sums, p, ev)
  local id = p.teams.view .. '\0' .. ev.team
  local sum = sums[id]
  if sum == nil then
    local old = entry_in(p.teams, ev.team)
    sum = {p = p, team = ev.team, old = old, signed = old and old.signed or 0}
    sums[id] = sum
    sums[#sums + 1] = sum
  end
  local score = sum.signed * b.sign + ev.value
  if score > b.max or score < -b.max then
    b.refused = b.refused + 1
    return
  end
  local was = sum.tie or (sum.old and sum.old.tie)
  local tie = (was and reached_before(ev.tie, was)) and was or ev.tie
  if sum.old == nil or ev.value ~= 0 or tie ~= was then
    sum.signed, sum.tie, sum.changed = score * b.sign, tie, true
  end
end

local function put_teams(sums)
  for _, sum in ipairs(sums) do
    if sum.changed then
      local v = sum.p.teams
      put_entry(v, sum.team, sum.old, sum.signed, sum.tie, '')
      -- A team new to the view may be its first: then the view's keys were just made.
      expire_made(sum.old == nil and redis.call('ZCARD', v.view) == 1,
                  {v.view, v.distinct, v.ties}, sum.p.expire)
    end
  end
end

-- The batch's regions added to the board's user-regions hash (k.user_regions; shared/keys.py):
-- each user's field gets the regions it lacks, kept sorted byte by byte (so that batches applied
-- in any order leave the same field), in one HMGET and one HSET. A user with no field yet may
-- have the set of the layout before (k.legacy[i], the key of event i; none on a replay onto
-- staging): its regions are taken in, and the set goes.
local function add_regions(k, evs)
  local users, wanted, legacy = {}, {}, {}
  for i, ev in ipairs(evs) do
    local list = wanted[ev.user]
    if list == nil then
      list = {}
      wanted[ev.user] = list
      users[#users + 1] = ev.user
      legacy[#users] = k.legacy and k.legacy[i]
    end
    list[#list + 1] = ev.region
  end
  local fields, changed, gone = redis.call('HMGET', k.user_regions, unpack(users)), {}, {}
  for j, user in ipairs(users) do
    local field, list = fields[j], nil
    if field then
      list = regions_in(field)
    else
      list = legacy[j] and redis.call('SMEMBERS', legacy[j]) or {}
      if #list > 0 then gone[#gone + 1] = legacy[j] end
    end
    local has, before = {}, #list
    for _, name in ipairs(list) do has[name] = true end
    for _, name in ipairs(wanted[user]) do
      if not has[name] then
        has[name] = true
        list[#list + 1] = name
      end
    end
    if #list > before or not field then
      table.sort(list, bytes_less)
      changed[#changed + 1] = user
      changed[#changed + 1] = table.concat(list, ' ')
    end
  end
  if #changed > 0 then redis.call('HSET', k.user_regions, unpack(changed)) end
  if #gone > 0 then redis.call('DEL', unpack(gone)) end
end

--[[
The batch's teams in the board's user-team hash (k.user_team; shared/keys.py): each user's field
holds the team of its latest event that named one, latest by accepted_at, whatever order the
events are derived in (batches of different relays come in no set order); the field
team_stamp(user) holds that accepted_at. Of two events accepted in the same millisecond the team
greater byte by byte is kept, so that the order does not decide that either. A field without
its stamp (the layout before kept none) is older than any event: the batch's team replaces it.
One HMGET and at most one HSET; evs: the events with a team.
]]
local function team_later(at, team, than_at, than_team)
  return bytes_less(than_at, at) or (at == than_at and bytes_less(than_team, team))
end

local function set_teams(user_team, evs)
  if #evs == 0 then return end
  local users, latest = {}, {}
  for _, ev in ipairs(evs) do
    local at = string.match(ev.entry, '"accepted_at":"([^"]*)"') or ''
    local best = latest[ev.user]
    if best == nil then users[#users + 1] = ev.user end
    if best == nil or team_later(at, ev.team, best.at, best.team) then
      latest[ev.user] = {at = at, team = ev.team}
    end
  end
  local fields = {}
  for _, user in ipairs(users) do
    fields[#fields + 1] = user
    fields[#fields + 1] = team_stamp(user)
  end
  local stored, changed = redis.call('HMGET', user_team, unpack(fields)), {}
  for j, user in ipairs(users) do
    local mine, team, at = latest[user], stored[2 * j - 1], stored[2 * j]
    if not team or not at or team_later(mine.at, mine.team, at, team) then
      changed[#changed + 1] = user
      changed[#changed + 1] = mine.team
      changed[#changed + 1] = team_stamp(user)
      changed[#changed + 1] = mine.at
    end
  end
  if #changed > 0 then redis.call('HSET', user_team, unpack(changed)) end
end

--[[
The feed: the newest accepted events, newest first, whatever order they are derived in (batches
of different relays come in no set order; a rebuild replays in its own). An entry's place is its
accepted_at (RFC 3339 in milliseconds, UTC: compares as text), then its event id and user. The
entries newer than the batch's oldest are taken off the top (LPOP: as many as are newer, most
often none), merged with the batch, and pushed back, oldest first; so a call reads and rewrites
only the entries out of order, and leaves out at once those too old for a full feed. A feed kept in delivery order before stays
as it is below the place of the oldest entry derived since, and is pushed out by newer ones.
The fields are matched in the entry's text: they come before any text a client chose but the
display name, whose quotes are escaped (shared/submit.py's _record()).
]]
local FEED_PAGE = 16

local function feed_place(entry)
  return (string.match(entry, '"accepted_at":"([^"]*)"') or '') .. '\0' ..
         (string.match(entry, '"event_id":"([^"]*)"') or '') .. '\0' ..
         (string.match(entry, '"user_id":"([^"]*)"') or '')
end

local function by_place(a, b) return a.place < b.place end

local function push_feed(feed, entries, feed_length)
  local batch = {}
  for i, entry in ipairs(entries) do batch[i] = {place = feed_place(entry), entry = entry} end
  table.sort(batch, by_place)
  if redis.call('LLEN', feed) >= feed_length then
    -- Full: an entry older than its last is out of it at once (a backlog of one relay drained
    -- after another's newer events filled it costs nothing here).
    local last, kept = feed_place(redis.call('LINDEX', feed, -1)), {}
    for _, item in ipairs(batch) do
      if item.place > last then kept[#kept + 1] = item end
    end
    if #kept == 0 then return end
    batch = kept
  end
  local oldest, newer, from = batch[1].place, 0, 0
  repeat  -- how many entries at the top are newer than the batch's oldest
    local page = redis.call('LRANGE', feed, from, from + FEED_PAGE - 1)
    for _, entry in ipairs(page) do
      if feed_place(entry) < oldest then break end
      newer = newer + 1
    end
    from = from + FEED_PAGE
  until newer < from or newer >= feed_length
  if newer > 0 then
    for _, entry in ipairs(redis.call('LPOP', feed, newer)) do
      batch[#batch + 1] = {place = feed_place(entry), entry = entry}
    end
    table.sort(batch, by_place)
  end
  local values = {}
  for i, item in ipairs(batch) do values[i] = item.entry end
  -- LPUSH pushes its values in turn: the newest ends up first.
  if redis.call('LPUSH', feed, unpack(values)) > feed_length then
    redis.call('LTRIM', feed, 0, feed_length - 1)
  end
end

-- A batch of events' derived views, each event applied in turn as if alone, but with one
-- command per key (and team): k: {feed, user_team, user_regions (the hash), legacy = {key...}
-- (add_regions(), or nil), periods = {{regions, players, events, expire, teams (view_of(), or
-- nil)}...}}, one legacy and periods entry per event, the periods' keys the same for every
-- event of one period; evs:
-- {entry (the feed's JSON), user, region, team ('': none), value, tie}..., in the order they
-- were accepted; b: {sign (1 descending, -1 ascending), max, refused}.
local function derive_events(k, evs, feed_length, b)
  if #evs == 0 then return end
  local entries, with_team, periods, sums = {}, {}, {}, {}
  for i, ev in ipairs(evs) do
    entries[i] = ev.entry
    if ev.team ~= '' then with_team[#with_team + 1] = ev end
    for _, p in ipairs(k.periods[i]) do
      local seen = periods[p.events]
      if seen == nil then
        seen = {p = p, users = {}, regions = {}}
        periods[p.events] = seen
        periods[#periods + 1] = seen
      end
      seen.users[#seen.users + 1] = ev.user
      seen.regions[#seen.regions + 1] = ev.region
      if p.teams and ev.team ~= '' then sum_teams(b, sums, p, ev) end
    end
  end
  put_teams(sums)
  push_feed(k.feed, entries, feed_length)
  set_teams(k.user_team, with_team)
  add_regions(k, evs)
  for _, seen in ipairs(periods) do
    local p = seen.p
    expire_made(redis.call('SADD', p.regions, unpack(seen.regions)) > 0, {p.regions}, p.expire)
    -- Every event of the period adds to both, so the period's first events make them.
    local made = redis.call('INCRBY', p.events, #seen.users) == #seen.users
    redis.call('PFADD', p.players, unpack(seen.users))
    expire_made(made, {p.players, p.events}, p.expire)
  end
end

--[[
A regional board's distinct-score set, where it has one (dense reads asked for it, and the
aggregator built it: merge.lua's dense_build), or the set being built: each pair given, the
pair (signed score, subscore part) an entry of a batch's event took and the one it held before
(the outbox entry's previous_score and previous_subscore), is made a member exactly when an
entry of the view holds it now. The answer depends only on the view as it is, not on the events
or their order: a batch redelivered, or batches derived in another order, or an event derived
after a later write changed the pair again, leave the set as exact as the view (every change
of a pair is an event, whose sync comes after it). Adds before removals, so that the set is not
emptied (and so deleted) while the view has members. A view with neither set costs two EXISTS.
The pairs are args[from], args[from + 1], ...: count of them.
]]
local function sync_pairs(view, distinct, building, args, from, count)
  local set = distinct
  if redis.call('EXISTS', distinct) == 0 then
    if redis.call('EXISTS', building) == 0 then return end
    set = building
  end
  local added, gone = {}, {}
  for i = from, from + 2 * count - 1, 2 do
    local signed, sub = tonumber(args[i]), args[i + 1]
    if held(view, signed, sub) then
      added[#added + 1] = fmt(signed)
      added[#added + 1] = distinct_member(signed, sub)
    else
      gone[#gone + 1] = distinct_member(signed, sub)
    end
  end
  if #added > 0 then redis.call('ZADD', set, unpack(added)) end
  if #gone > 0 then redis.call('ZREM', set, unpack(gone)) end
end

--[[
derive: a batch of one board's events, in the order of acceptance (the outbox's order, which
the stream keeps); neither the team sums (sum_teams()) nor the feed (push_feed()) depend on
that order; at most a hundred or so (CHUNK in services/aggregator/derive.py), each key's
values going to one command.
KEYS: feed, user team, the board's as_of hash, its user-regions hash; then three per regional
      board whose entries the batch changed: the board, its distinct set, the set being built;
      then six per period of
      the batch (each period id once, however many events name it): regions set, players,
      event count, team board, its distinct set, its tie keys; then three per event: its
      record, the record of the layout before (its board and id alone: an event accepted before
      ids were scoped to users waits there, live.lua's record_of_event()), the user's regions
      set of the layout before (add_regions()).
ARGV: feed length, as_of (RFC 3339), '1' if the board sums teams (incr), '1' descending / '0'
      ascending, the largest score held exactly, how many regional boards; then per regional
      board: how many pairs, then each pair's signed score and subscore part (sync_pairs());
      then how many periods, and each one's expire-at (0: never); then per event: its period
      count, the (1-based) number of each of its periods, its feed entry (JSON), user, region,
      team ('' none), value, tie key.
Sets the as_of hash's 'derived' field to as_of. Returns {events applied now, team sums left
out (beyond the exact scores)}. The pairs are synced whether or not their events are still
pending: a sync is idempotent.
]]
local KEYS_PER_DERIVED_PERIOD = 6

-- The batch's periods (KEYS from ki, expiries in ARGV from ai), as derive_events() takes them:
-- with their team board where the board sums teams. Returns them and the next KEYS and ARGV.
local function derived_periods(keys, args, ki, ai, sums_teams)
  local periods = {}
  for i = 1, tonumber(args[ai]) do
    local p = {regions = keys[ki], players = keys[ki + 1], events = keys[ki + 2],
               expire = tonumber(args[ai + i])}
    if sums_teams then p.teams = view_of(keys[ki + 3], keys[ki + 4], keys[ki + 5]) end
    periods[i] = p
    ki = ki + KEYS_PER_DERIVED_PERIOD
  end
  return periods, ki, ai + 1 + #periods
end

-- sync_pairs() of `count` regional boards: their keys, three each, from KEYS[ki]; from
-- ARGV[ai], per board how many pairs, then the pairs. Returns the next KEYS and ARGV.
local function sync_boards(keys, args, ki, ai, count)
  for _ = 1, count do
    local n = tonumber(args[ai])
    sync_pairs(keys[ki], keys[ki + 1], keys[ki + 2], args, ai + 1, n)
    ki, ai = ki + 3, ai + 1 + 2 * n
  end
  return ki, ai
end

local function derive(keys, args)
  local ki, ai = sync_boards(keys, args, 5, 7, tonumber(args[6]))
  local sums_teams = args[3] == '1'
  local b = {sign = args[4] == '1' and 1 or -1, max = tonumber(args[5]), refused = 0}
  local batch_periods
  batch_periods, ki, ai = derived_periods(keys, args, ki, ai, sums_teams)
  local k = {feed = keys[1], user_team = keys[2], user_regions = keys[4], legacy = {},
             periods = {}}
  local evs = {}
  while ai <= #args do
    local count = tonumber(args[ai])
    local record, marks = record_of_event(keys[ki], keys[ki + 1])
    local periods = {}
    for i = 1, count do periods[i] = batch_periods[tonumber(args[ai + i])] end
    ai = ai + 1 + count
    local ev = {entry = args[ai], user = args[ai + 1], region = args[ai + 2],
                team = args[ai + 3], value = tonumber(args[ai + 4]), tie = args[ai + 5]}
    local legacy = keys[ki + 2]
    ki, ai = ki + 3, ai + 6
    -- Only events still pending, each once: a redelivered event, or one twice in the batch,
    -- finds its bit cleared.
    if pending(marks) then
      clear_pending(record, marks)
      evs[#evs + 1] = ev
      k.legacy[#evs], k.periods[#evs] = legacy, periods
    end
  end
  derive_events(k, evs, tonumber(args[1]), b)
  redis.call('HSET', keys[3], 'derived', args[2])
  return {#evs, b.refused}
end

redis.register_function(FUNCTIONS.derive, derive)

--[[
sync_dropped: the pair sync alone (sync_pairs()) of events the aggregator leaves out (an erased
user's, services/aggregator/derive.py): their writes changed the regional boards all the same,
and an event's pairs are synced by no other step. The event's other views stay underived.
KEYS: three per regional board, as derive takes them. ARGV: how many boards; then per board how
many pairs, then each pair's signed score and subscore part. Returns the number of boards.
]]
local function sync_dropped(keys, args)
  sync_boards(keys, args, 1, 2, tonumber(args[1]))
  return tonumber(args[1])
end

redis.register_function(FUNCTIONS.sync_dropped, sync_dropped)

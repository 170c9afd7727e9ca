--[[
The views derived from accepted events (docs/architecture.md, "The aggregator"): the feed, the
user's regions and latest team, and per period the regions that have scores, the players
(HyperLogLog) and the count of accepted events. The aggregator applies them from the event
stream, one call per board and batch; the rebuild's replay (rebuild.lua) applies them to every
event it replays, through the same derive_events(), so that a rebuilt board equals the live
one.

Once per event: the write leaves the event's record with its derive-pending bit set
(write.lua, live.lua's PENDING_BIT); an event is applied only while its bit is set, and the bit
is cleared in the same atomic step, so that a redelivered batch derives nothing twice. A record
without the bit (written by the write of the layout before, which applied these views itself;
or expired, the event older than the idempotency TTL) derives nothing. The sets, the
HyperLogLog and the team hash are idempotent by nature; the counter and the feed are not, and
the bit guards them.
]]

-- Whether an event's record (its key) still waits for its derived views.
local function pending(record)
  local marks = marks_of(record)
  return marks ~= nil and is_marks(marks) and bit.band(marks, 2 ^ (7 - PENDING_BIT)) ~= 0
end

local function clear_pending(record) redis.call('SETBIT', record, PENDING_BIT, 0) end

-- A batch of events' derived views, each event applied in turn as if alone, but with one
-- command per key: k: {feed, user_team, user_regions = {key...}, periods = {{regions, players,
-- events, expire}...}}, one user_regions and periods entry per event, the periods' keys the
-- same for every event of one period; evs: {entry (the feed's JSON), user, region, team ('':
-- none)}..., in the order they were accepted.
local function derive_events(k, evs, feed_length)
  if #evs == 0 then return end
  local entries, teams, regions_of, periods = {}, {}, {}, {}
  for i, ev in ipairs(evs) do
    entries[i] = ev.entry
    if ev.team ~= '' then teams[#teams + 1] = ev.user; teams[#teams + 1] = ev.team end
    local key = k.user_regions[i]
    regions_of[key] = regions_of[key] or {}
    regions_of[key][#regions_of[key] + 1] = ev.region
    for _, p in ipairs(k.periods[i]) do
      local seen = periods[p.events]
      if seen == nil then
        seen = {p = p, users = {}, regions = {}}
        periods[p.events] = seen
        periods[#periods + 1] = seen
      end
      seen.users[#seen.users + 1] = ev.user
      seen.regions[#seen.regions + 1] = ev.region
    end
  end
  -- LPUSH pushes its values in turn: the last accepted ends up first.
  if redis.call('LPUSH', k.feed, unpack(entries)) > feed_length then
    redis.call('LTRIM', k.feed, 0, feed_length - 1)
  end
  if #teams > 0 then redis.call('HSET', k.user_team, unpack(teams)) end
  for key, regions in pairs(regions_of) do redis.call('SADD', key, unpack(regions)) end
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
derive: a batch of one board's events, in the order of acceptance (the outbox's order, which
the stream keeps), so that the feed is newest first; at most a thousand (CHUNK in
services/aggregator/derive.py), each key's values going to one command.
KEYS: feed, user team, the board's as_of hash; then two per event: its record, the user's
      regions; then three per period of the event: regions set, players, event count.
ARGV: feed length, as_of (RFC 3339), then per event: its period count, its feed entry (JSON),
      user, region, team ('' none), then per period its expire-at (0: never).
Sets the as_of hash's 'derived' field to as_of. Returns how many events were applied now.
]]
local function derive(keys, args)
  local ki, ai = 4, 3
  local k, evs = {feed = keys[1], user_team = keys[2], user_regions = {}, periods = {}}, {}
  while ai <= #args do
    local count, record = tonumber(args[ai]), keys[ki]
    local ev = {entry = args[ai + 1], user = args[ai + 2], region = args[ai + 3],
                team = args[ai + 4]}
    local user_regions, periods = keys[ki + 1], {}
    ki, ai = ki + 2, ai + 5
    for i = 1, count do
      periods[i] = {regions = keys[ki], players = keys[ki + 1], events = keys[ki + 2],
                    expire = tonumber(args[ai])}
      ki, ai = ki + 3, ai + 1
    end
    -- Only events still pending, each once: a redelivered event, or one twice in the batch,
    -- finds its bit cleared.
    if pending(record) then
      clear_pending(record)
      evs[#evs + 1] = ev
      k.user_regions[#evs], k.periods[#evs] = user_regions, periods
    end
  end
  derive_events(k, evs, tonumber(args[1]))
  redis.call('HSET', keys[3], 'derived', args[2])
  return #evs
end

redis.register_function(FUNCTIONS.derive, derive)

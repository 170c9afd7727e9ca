--[[
Rebuild of one board from the history database (services/rebuild/; the design and its
argument are in docs/reliability.md). A board is built into staging keys, which share the
board's hash tag and so its slot (shared/keys.py names them). While the board's flag key is set,
submit() journals every call it applies (a journaled call: a lean one is refused, write.lua);
rebuild_finish replays the journal's events the database did not hold yet onto staging and puts
staging in place of the live keys, in one step.
]]

-- submit()'s first keys: where a write answers (and the record of the layout before it reads),
-- queues, journals and notes the newest event. A replay is given scratch keys in their place,
-- and writes staging keys for the others.
local WRITE_OWN_KEYS = 6

-- The identity (shared/keys.py event_ref) of the event of a journaled submit() call: its JSON's
-- event id and its user.
local function call_ref(call) return event_ref(call.args[7], call.args[4]) end

--[[
KEYS: flag, journal, outbox, newest event. ARGV: ttl in ms (a safety net: a rebuild that dies
leaves nothing behind for long), the rebuild's token. Raises the flag, holding the token, and
starts an empty journal; or returns {'busy'} if another rebuild of the board holds the flag.
Returns {'ok', event refs...}: '<event_id>:<user_id>' (shared/keys.py event_ref) of every
outbox entry and of the newest event the write accepted (a bare event id, if the write of the
layout before noted it), the events applied before the flag that the history database may not
hold yet, or the aggregator not have derived yet, which the rebuild waits for.
]]
local function rebuild_begin(keys, args)
  local ttl = tonumber(args[1])
  if not redis.call('SET', keys[1], args[2], 'NX', 'PX', ttl) then return {'busy'} end
  redis.call('DEL', keys[2])
  redis.call('RPUSH', keys[2], 'begin')
  redis.call('PEXPIRE', keys[2], ttl)
  local ids = {'ok'}
  for _, entry in ipairs(redis.call('XRANGE', keys[3], '-', '+')) do
    local event = cjson.decode(entry[2][2])
    ids[#ids + 1] = event.event_id .. ':' .. event.user_id
  end
  local newest = redis.call('GET', keys[4])
  if newest then ids[#ids + 1] = newest end
  return ids
end

-- KEYS: flag, journal. ARGV: ttl in ms, token. Keeps the token's rebuild flag up; 0 if the flag
-- lapsed (journaling stopped meanwhile: the rebuild must start over).
local function rebuild_extend(keys, args)
  if redis.call('GET', keys[1]) ~= args[2] then return 0 end
  redis.call('PEXPIRE', keys[1], tonumber(args[1]))
  redis.call('PEXPIRE', keys[2], tonumber(args[1]))
  return 1
end

-- KEYS: flag, journal. ARGV: token. Ends the token's rebuild without a result.
local function rebuild_abort(keys, args)
  if redis.call('GET', keys[1]) ~= args[1] then return 0 end
  redis.call('DEL', keys[1], keys[2])
  return 1
end

-- derive_events()'s keys, event and board for a submit() call's KEYS and ARGV (write.lua's
-- layout).
local function derived_of(keys, args)
  local periods, teams = {}, args[2] == 'incr' and args[14] ~= ''
  for i = 1, tonumber(args[8]) do
    local base = KEYS_BEFORE + (i - 1) * KEYS_PER_PERIOD
    periods[i] = {regions = keys[base + 4], players = keys[base + 8], events = keys[base + 9],
                  expire = tonumber(args[ARGS_BEFORE + (i - 1) * ARGS_PER_PERIOD + 3])}
    if teams then periods[i].teams = view_of(keys[base + 5], keys[base + 6], keys[base + 7]) end
  end
  local k = {feed = keys[8], user_regions = keys[9], user_team = keys[10], periods = {periods}}
  local ev = {entry = args[7] .. '}', user = args[4], region = args[5], team = args[14],
              value = tonumber(args[3]), tie = args[15]}
  return k, ev, {sign = args[12] == '1' and 1 or -1, max = tonumber(args[16]), refused = 0}
end

--[[
Apply one event as submit() then the aggregator's derive step do, to the keys given (staging
ones), leaving no idempotency answer, newest event or outbox entry behind: KEYS and ARGV are
submit()'s, with its first six keys scratch keys (the flag one never set, so nothing is
journaled; the record of the layout before never written, so nothing answers from it).
Returns submit()'s status.
]]
local function replay(keys, args)
  local answer = submit(keys, args, JOURNALED)
  if answer[1] == 'ok' then
    local k, ev, b = derived_of(keys, args)
    derive_events(k, {ev}, tonumber(args[13]), b)
  end
  redis.call('DEL', keys[1], keys[3], keys[6])
  return answer[1]
end

-- The board's hash tag ('{<prefix>:<board>}') that every one of its keys starts with.
local function tag_of(key) return string.match(key, '^({[^}]*})') end

-- Whether the call's i-th key is an event counter (shared/submit.py replayed_keys), or a
-- regional view (write.lua period_of: the first of a period's keys).
local function period_slot(i) return (i - KEYS_BEFORE) % KEYS_PER_PERIOD end
local function is_counter(i) return i > KEYS_BEFORE and period_slot(i) == 0 end
local function is_region_view(i) return i > KEYS_BEFORE and period_slot(i) == 1 end

-- Whether a key carries the board's hash tag (and so lives in the slot of the given keys).
local function tagged(key, tag) return string.sub(key, 1, #tag + 1) == tag .. ':' end

--[[
One pass over the journal: the calls to replay (those of events not in `known`), their keys
mapped to scratch and staging ones, and every call's record (its first key: the live
idempotency record) added to `records`. `staging` maps each live key the caller gave to its
staging copy. An event journaled after the caller read the journal may name a live key it did
not give (a user's keys, a new region or period, its own record): its staging name is made here
as shared/keys.py staged() makes it, and added to `staging` (and to `counters` for an event
counter), with the distinct-score sets of a regional view to delete (`dropped`). Such a key
shares the board's hash tag, and so the slot of the given keys, as a function's keys must in a
cluster; a key outside the tag returns nil and that key.
]]
local function read_journal(journal, scratch, tag, staging, counters, dropped, records, known)
  local calls = {}
  for _, raw in ipairs(redis.call('LRANGE', journal, 1, -1)) do
    local call = cjson.decode(raw)
    if not tagged(call.keys[1], tag) then return nil, call.keys[1] end
    records[call.keys[1]] = true
    if not known[call_ref(call)] then
      local mapped = {unpack(scratch)}
      for i = WRITE_OWN_KEYS + 1, #call.keys do
        local live = call.keys[i]
        if staging[live] == nil then
          if not tagged(live, tag) then return nil, live end
          staging[live] = tag .. ':rebuild' .. string.sub(live, #tag + 1)
          if is_counter(i) then counters[#counters + 1] = live end
          if is_region_view(i) then
            dropped[live .. ':distinct'] = true
            dropped[live .. ':distinct:building'] = true
          end
        end
        mapped[i] = staging[live]
      end
      calls[#calls + 1] = {keys = mapped, args = call.args}
    end
  end
  return calls
end

--[[
KEYS: flag, journal, the six scratch keys a replay is given for submit()'s first six, the
records of the journal's events, then pairs of a live key the rebuild replaces and its staging
key, the event counters' pairs first.
ARGV: how many pairs are event counters', the token, how many records, then the refs
('<event_id>:<user_id>') of the journal's events that the database already held when the
board was read from it.
Returns {'expired', ''} if the token's flag lapsed. Replays the journal's other events onto
staging: those journaled after the caller read the journal as well, naming keys it did not give
(see read_journal; {'unknown', key}, writing nothing, for a key outside the board's hash
tag). Then refuses with {'behind', key} if a live event counter is above its staged one (an
event applied before the flag was not in the database yet: the caller aborts and starts over
later). Otherwise renames each staging key over its live one (a live key with no staging one is
deleted), clears the derive-pending bit of every journaled event (staging holds its derived
views: the aggregator must not apply them again to what staging becomes), drops the flag and
the journal and returns {'ok', events replayed}. (Events applied before the flag were derived
before the rebuild read the database: services/rebuild waits for that.)
]]
local function rebuild_finish(keys, args)
  if redis.call('GET', keys[1]) ~= args[2] then return {'expired', ''} end
  local tag = tag_of(keys[1])
  local first_record = WRITE_OWN_KEYS + 3
  local first_pair = first_record + tonumber(args[3])
  local known, staging, records, counters, dropped = {}, {}, {}, {}, {}
  for i = first_record, first_pair - 1 do records[keys[i]] = true end
  for i = first_pair, #keys, 2 do staging[keys[i]] = keys[i + 1] end
  for i = first_pair, first_pair + 2 * tonumber(args[1]) - 1, 2 do
    counters[#counters + 1] = keys[i]
  end
  for i = 4, #args do known[args[i]] = true end
  local calls, unknown = read_journal(keys[2], {unpack(keys, 3, first_record - 1)}, tag,
                                      staging, counters, dropped, records, known)
  if calls == nil then return {'unknown', unknown} end
  for _, call in ipairs(calls) do replay(call.keys, call.args) end
  for _, live in ipairs(counters) do
    local now = tonumber(redis.call('GET', live) or '0')
    if now > tonumber(redis.call('GET', staging[live]) or '0') then return {'behind', live} end
  end
  for live, staged in pairs(staging) do
    if redis.call('EXISTS', staged) == 1 then
      redis.call('RENAME', staged, live)
    else
      redis.call('DEL', live)
    end
  end
  for set in pairs(dropped) do redis.call('DEL', set) end
  for record in pairs(records) do
    local marks = marks_of(record)
    if pending(marks) then clear_pending(record, marks) end
  end
  redis.call('DEL', keys[1], keys[2])
  return {'ok', #calls}
end

redis.register_function(FUNCTIONS.rebuild_begin, rebuild_begin)
redis.register_function(FUNCTIONS.rebuild_extend, rebuild_extend)
redis.register_function(FUNCTIONS.rebuild_abort, rebuild_abort)
redis.register_function(FUNCTIONS.replay, replay)
redis.register_function(FUNCTIONS.rebuild_finish, rebuild_finish)

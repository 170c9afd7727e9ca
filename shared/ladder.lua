#!lua name=ladder_v1

--[[
The atomic write of one accepted score (API.md section 4; DESIGN.md invariant 1).

One call: check the idempotency record and the outbox bound; compute the new score of every
period's regional board and team board (refusing the whole call if any leaves its encodable
range); write them with their distinct-score sets (for dense ranks); read rank and previous rank;
name whoever this write pushed out of each notify bracket; count the period's players and events;
record the answer under the event id; append the event to the feed and the outbox. Every key
shares one hash tag.

KEYS: idem, outbox, names, feed, user regions, user team; then seven per period: regional board,
      its distinct set, regions set, team board, its distinct set, players (HyperLogLog), event
      count.
ARGV: 1 body hash, 2 operator, 3 value, 4 user_id, 5 region, 6 display_name ('' for none),
      7 the event as JSON without its closing brace, 8 period count, 9 idempotency ttl,
      10 outbox max, 11 brackets (comma-separated), 12 '1' descending / '0' ascending,
      13 feed length, 14 team_id ('' for none),
      then six per period: name, id, scale (2^time bits), tick, max score, expire-at (0: never).
Returns {status, payload}: ok / duplicate with the outbox entry, conflict, range, outbox_full.
]]

local KEYS_BEFORE, KEYS_PER_PERIOD, ARGS_BEFORE, ARGS_PER_PERIOD = 6, 7, 14, 6

local function fmt(n) return string.format('%.17g', n) end

local function signed_of(composite, scale)
  return math.floor(tonumber(composite) / scale)
end

-- Whether any member of a view still holds the signed score: its composites are the half-open
-- range [signed * scale, (signed + 1) * scale).
local function held(view, signed, scale)
  return redis.call('ZCOUNT', view, fmt(signed * scale), '(' .. fmt((signed + 1) * scale)) > 0
end

-- Move one member of a view from old_signed (nil: absent) to new_signed, keeping the view's
-- distinct-score set right: the new score is added (a no-op if someone holds it already), the
-- old one removed once nobody holds it. Added before the old one goes, so the distinct set is
-- never emptied (and so deleted by Redis) while the view has members: both keys are made
-- together, by a view's first member. Returns 1 if the member is new to the view, else 0.
local function put_entry(view, distinct, member, composite, old_signed, new_signed, scale)
  local added = redis.call('ZADD', view, fmt(composite), member)
  if old_signed == new_signed then return added end
  local k = fmt(new_signed)
  redis.call('ZADD', distinct, k, k)
  if old_signed ~= nil and not held(view, old_signed, scale) then
    redis.call('ZREM', distinct, fmt(old_signed))
  end
  return added
end

local function expire(keys, at)
  if at > 0 then
    for _, key in ipairs(keys) do redis.call('EXPIREAT', key, at) end
  end
end

-- expire(), when `made` says the write just made the keys. A period's keys all expire at the
-- same moment, so a key needs it once, when it is made; setting it on every write was a third
-- of a write's Redis commands. (A changed retention therefore applies to keys made after it.)
local function expire_made(made, keys, at)
  if made then expire(keys, at) end
end

local function submit(keys, args)
  local stored = redis.call('GET', keys[1])
  if stored then
    local sep = string.find(stored, '\n', 1, true)
    if string.sub(stored, 1, sep - 1) == args[1] then
      return {'duplicate', string.sub(stored, sep + 1)}
    end
    return {'conflict', ''}
  end
  if redis.call('XLEN', keys[2]) >= tonumber(args[10]) then
    return {'outbox_full', ''}
  end

  local op, value, user = args[2], tonumber(args[3]), args[4]
  local region, display, team = args[5], args[6], args[14]
  local n, desc = tonumber(args[8]), args[12] == '1'
  local sign = desc and 1 or -1
  local teams = op == 'incr' and team ~= ''
  local brackets = {}
  for t in string.gmatch(args[11], '%d+') do brackets[#brackets + 1] = tonumber(t) end

  -- First pass: decide every period's new scores; refuse before writing anything.
  local plan = {}
  for i = 1, n do
    local a, k = ARGS_BEFORE + (i - 1) * ARGS_PER_PERIOD, KEYS_BEFORE + (i - 1) * KEYS_PER_PERIOD
    local p = {name = args[a + 1], id = args[a + 2], scale = tonumber(args[a + 3]),
               tick = tonumber(args[a + 4]), max = tonumber(args[a + 5]),
               expire = tonumber(args[a + 6]),
               board = keys[k + 1], distinct = keys[k + 2], regions = keys[k + 3],
               teams = keys[k + 4], teams_distinct = keys[k + 5], players = keys[k + 6],
               events = keys[k + 7]}
    local old = redis.call('ZSCORE', p.board, user)
    if old then p.old_signed = signed_of(old, p.scale) end
    local old_score = p.old_signed and p.old_signed * sign
    if op == 'incr' then
      p.score = (old_score or 0) + value
      p.changed = old_score == nil or value ~= 0
    elseif op == 'best' then
      if old_score == nil or (desc and value > old_score) or ((not desc) and value < old_score) then
        p.score, p.changed = value, true
      else
        p.score, p.changed = old_score, false
      end
    else
      p.score = value
      p.changed = old_score == nil or value ~= old_score
    end
    if p.score > p.max or p.score < -p.max then
      return {'range', p.name .. ' score would be ' .. fmt(p.score) ..
              ', beyond the largest encodable ' .. fmt(p.max)}
    end
    if teams then
      local old_team = redis.call('ZSCORE', p.teams, team)
      if old_team then p.team_old_signed = signed_of(old_team, p.scale) end
      p.team_score = (p.team_old_signed or 0) * sign + value
      if p.team_score > p.max or p.team_score < -p.max then
        return {'range', p.name .. ' team score would be ' .. fmt(p.team_score) ..
                ', beyond the largest encodable ' .. fmt(p.max)}
      end
    end
    plan[i] = p
  end

  -- Second pass: write, and read what the write did.
  local periods = {}
  for i = 1, n do
    local p = plan[i]
    local reached = p.scale - 1 - p.tick
    local prev = redis.call('ZREVRANK', p.board, user)
    local rank
    if p.changed then
      local signed = p.score * sign
      -- A member new to the view may be its first: then the view's keys were just made.
      local added = put_entry(p.board, p.distinct, user, signed * p.scale + reached,
                              p.old_signed, signed, p.scale)
      expire_made(added == 1 and redis.call('ZCARD', p.board) == 1, {p.board, p.distinct},
                  p.expire)
      rank = redis.call('ZREVRANK', p.board, user) + 1
    else
      rank = prev + 1
    end
    if teams and (p.team_old_signed == nil or value ~= 0) then
      local signed = p.team_score * sign
      local added = put_entry(p.teams, p.teams_distinct, team, signed * p.scale + reached,
                              p.team_old_signed, signed, p.scale)
      expire_made(added == 1 and redis.call('ZCARD', p.teams) == 1, {p.teams, p.teams_distinct},
                  p.expire)
    end
    expire_made(redis.call('SADD', p.regions, region) == 1, {p.regions}, p.expire)
    -- Every write of the period adds to both, so the period's first write makes them.
    local first = redis.call('INCR', p.events) == 1
    redis.call('PFADD', p.players, user)
    expire_made(first, {p.players, p.events}, p.expire)
    local pushed = {}
    for _, t in ipairs(brackets) do
      if rank <= t and (prev == false or prev + 1 > t) then
        local out = redis.call('ZREVRANGE', p.board, t, t)
        if out[1] then pushed[tostring(t)] = out[1] end
      end
    end
    local previous = cjson.null
    if prev then previous = prev + 1 end
    periods[p.name] = {period_id = p.id, score = p.score, rank = rank,
                       previous_rank = previous, improved = p.changed, pushed_out = pushed}
  end

  if display ~= '' then redis.call('HSET', keys[3], user, display) end
  redis.call('SADD', keys[5], region)
  if team ~= '' then redis.call('HSET', keys[6], user, team) end
  local event = args[7] .. '}'
  local feed_length = tonumber(args[13])
  if redis.call('LPUSH', keys[4], event) > feed_length then
    redis.call('LTRIM', keys[4], 0, feed_length - 1)
  end
  local entry = args[7] .. ',"periods":' .. cjson.encode(periods) .. '}'
  redis.call('SET', keys[1], args[1] .. '\n' .. entry, 'EX', tonumber(args[9]))
  redis.call('XADD', keys[2], '*', 'e', entry)
  -- While a rebuild of this board runs (see rebuild_finish below), journal what was applied.
  local flag = string.gsub(keys[2], ':outbox$', ':rebuilding')
  if redis.call('EXISTS', flag) == 1 then
    redis.call('RPUSH', (string.gsub(keys[2], ':outbox$', ':rebuild:journal')),
               cjson.encode({keys = keys, args = args}))
  end
  return {'ok', entry}
end

--[[
Replace entries of a merged view (the aggregator's global boards), keeping its distinct-score
set right. KEYS: view, distinct. ARGV: scale, expire-at (0: never), then pairs of member
and composite ('' removes the member). Returns how many entries changed.
]]
local function put(keys, args)
  local scale, at, changed = tonumber(args[1]), tonumber(args[2]), 0
  for j = 3, #args, 2 do
    local member, composite = args[j], args[j + 1]
    local old = redis.call('ZSCORE', keys[1], member)
    local old_signed = nil
    if old then old_signed = signed_of(old, scale) end
    if composite == '' then
      if old then
        redis.call('ZREM', keys[1], member)
        if not held(keys[1], old_signed, scale) then
          redis.call('ZREM', keys[2], fmt(old_signed))
        end
        changed = changed + 1
      end
    elseif old ~= composite and (old == false or tonumber(old) ~= tonumber(composite)) then
      put_entry(keys[1], keys[2], member, tonumber(composite), old_signed,
                signed_of(composite, scale), scale)
      changed = changed + 1
    end
  end
  expire(keys, at)
  return changed
end

--[[
Award a badge exactly once (API.md section 3): KEYS[1] the user's badges hash. ARGV badge,
awarded-at, channel, message. Records the badge and publishes the message in one step, so a
badge is pushed exactly when it is first recorded, however often its event is delivered.
Returns 1 if awarded now, 0 if the user had it already.
]]
local function award(keys, args)
  if redis.call('HSETNX', keys[1], args[1], args[2]) == 0 then return 0 end
  redis.call('PUBLISH', args[3], args[4])
  return 1
end

--[[
A token bucket (API.md section 9a): KEYS[1] the bucket; ARGV rate a second, burst, now in ms,
cost. Takes the tokens and returns {1, 0}, or takes nothing and returns {0, ms until enough}.
]]
local function take(keys, args)
  local rate, burst = tonumber(args[1]), tonumber(args[2])
  local now, cost = tonumber(args[3]), tonumber(args[4])
  local state = redis.call('HMGET', keys[1], 'tokens', 'at')
  local tokens, at = tonumber(state[1]), tonumber(state[2])
  if tokens == nil then tokens, at = burst, now end
  tokens = math.min(burst, tokens + math.max(0, now - at) * rate / 1000)
  local ttl = math.ceil(burst / rate * 1000) + 1000
  if tokens < cost then
    redis.call('HSET', keys[1], 'tokens', tostring(tokens), 'at', tostring(now))
    redis.call('PEXPIRE', keys[1], ttl)
    return {0, math.ceil((cost - tokens) * 1000 / rate)}
  end
  redis.call('HSET', keys[1], 'tokens', tostring(tokens - cost), 'at', tostring(now))
  redis.call('PEXPIRE', keys[1], ttl)
  return {1, 0}
end

-- A token bucket's tokens at `now` (ms), refilled since its last take; writes nothing.
local function tokens_at(bucket, rate, burst, now)
  local state = redis.call('HMGET', bucket, 'tokens', 'at')
  local tokens, at = tonumber(state[1]), tonumber(state[2])
  if tokens == nil then return burst end
  return math.min(burst, tokens + math.max(0, now - at) * rate / 1000)
end

--[[
A rate-limited score write, in one call (API.md sections 4 and 9a): the user's and the
credential's token buckets are checked, then submit() runs, and only a write it accepted takes
one token from each. A refusal by either bucket returns before anything is read or written; so
does every other refusal of submit(), which leaves the buckets as they were. Both buckets are
the board's own ({P:B}:rate:...), so that the whole call stays in the board's hash slot.

KEYS: the user's bucket, the credential's bucket, then submit()'s keys.
ARGV: user rate a second, user burst, credential rate, credential burst, now in ms, then
      submit()'s arguments.
Returns submit()'s answer, or {'limited', '<user | credential> <ms until a token is there>'}.
]]
local function write(keys, args)
  local now = tonumber(args[5])
  local limits = {{'user', keys[1], tonumber(args[1]), tonumber(args[2])},
                  {'credential', keys[2], tonumber(args[3]), tonumber(args[4])}}
  local left = {}
  for i, limit in ipairs(limits) do
    local tokens = tokens_at(limit[2], limit[3], limit[4], now)
    if tokens < 1 then
      return {'limited', limit[1] .. ' ' .. math.ceil((1 - tokens) * 1000 / limit[3])}
    end
    left[i] = tokens - 1
  end
  local result = submit({unpack(keys, 3)}, {unpack(args, 6)})
  if result[1] == 'ok' then
    for i, limit in ipairs(limits) do
      redis.call('HSET', limit[2], 'tokens', tostring(left[i]), 'at', tostring(now))
      redis.call('PEXPIRE', limit[2], math.ceil(limit[4] / limit[3] * 1000) + 1000)
    end
  end
  return result
end

--[[
The hot view's events (API.md section 8a). KEYS: the board's hot event set (member
'<event_id>|<user_id>|<value>', score occurred_at in ms), then one hash per window holding, for
the events inside it, 's:<user>' (their sum) and 'c:<user>' (their count), and 'at': the
window's start in ms (an event at or before it is outside).

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
Count one event toward its member's team contribution in every period, exactly once (the MVP
view, API.md section 8a). KEYS: the aggregator's seen key for the event, then two per period:
the team's member contributions (zset), the period's user -> "<accepted ms>|<team>" hash.
ARGV: seen ttl, value, user, team, accepted at (ms), then per period its expire-at (0: never).
The user's team in a period is the one its latest accepted event named. Returns 1 if counted
now, 0 if the event had been counted before.
]]
local function contribute(keys, args)
  if not redis.call('SET', keys[1], '1', 'NX', 'EX', tonumber(args[1])) then return 0 end
  local value, user, team, accepted = tonumber(args[2]), args[3], args[4], tonumber(args[5])
  for i = 1, (#keys - 1) / 2 do
    local members, teams, at = keys[2 * i], keys[2 * i + 1], tonumber(args[5 + i])
    redis.call('ZINCRBY', members, value, user)
    local latest = redis.call('HGET', teams, user)
    if not latest or tonumber(string.match(latest, '^(%d+)|')) <= accepted then
      redis.call('HSET', teams, user, args[5] .. '|' .. team)
    end
    expire({members, teams}, at)
  end
  return 1
end

--[[
Rebuild of one board from the history database (services/history/rebuild.py; the design and its
argument are in docs/reliability.md). A board is built into staging keys: each live key with
':rebuild:' after its hash tag ('{P:B}:feed' is staged as '{P:B}:rebuild:feed'), so staging
shares the board's slot. While the board's flag key is set, submit() journals every event it
applies; rebuild_finish replays the journal's events the database did not hold yet onto staging
and puts staging in place of the live keys, in one step.
]]
local function staged(key)
  return (string.gsub(key, '^(%b{}):', '%1:rebuild:', 1))
end

--[[
KEYS: flag, journal, outbox, feed. ARGV: ttl in ms (a safety net: a rebuild that dies leaves
nothing behind for long), the rebuild's token. Raises the flag, holding the token, and starts an
empty journal; or returns {'busy'} if another rebuild of the board holds the flag. Returns
{'ok', event ids...}: those of every outbox entry and of the newest feed entry, the events
applied before the flag that the history database may not hold yet, which the rebuild waits for.
]]
local function rebuild_begin(keys, args)
  local ttl = tonumber(args[1])
  if not redis.call('SET', keys[1], args[2], 'NX', 'PX', ttl) then return {'busy'} end
  redis.call('DEL', keys[2])
  redis.call('RPUSH', keys[2], 'begin')
  redis.call('PEXPIRE', keys[2], ttl)
  local ids = {'ok'}
  for _, entry in ipairs(redis.call('XRANGE', keys[3], '-', '+')) do
    ids[#ids + 1] = cjson.decode(entry[2][2]).event_id
  end
  local newest = redis.call('LINDEX', keys[4], 0)
  if newest then ids[#ids + 1] = cjson.decode(newest).event_id end
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

--[[
Apply one event as submit() does, to the keys given (staging ones), leaving no idempotency
answer and no outbox entry behind: KEYS and ARGV are submit()'s, with KEYS[1] and KEYS[2]
scratch keys. Returns submit()'s status.
]]
local function replay(keys, args)
  local answer = submit(keys, args)
  redis.call('DEL', keys[1], keys[2])
  return answer[1]
end

--[[
KEYS: flag, journal, then every live key the rebuild replaces, the event counters first.
ARGV: how many of those keys are event counters, the token, then the ids of the journal's
events that the database already held when the board was read from it. Returns
{'expired', ''} if the token's flag lapsed. Replays the journal's other events onto staging;
then refuses with {'behind', key} if a live event counter is above its staged one (an event
applied before the flag was not in the database yet: the caller aborts and starts over later).
Otherwise renames each staging key over its live one (a live key with no staging one is
deleted), drops the flag and the journal and returns {'ok', events replayed}.
]]
local function rebuild_finish(keys, args)
  if redis.call('GET', keys[1]) ~= args[2] then return {'expired', ''} end
  local counters, known, live = {}, {}, {}
  for i = 3, #keys do
    live[keys[i]] = true
    if i - 2 <= tonumber(args[1]) then counters[keys[i]] = true end
  end
  for i = 3, #args do known[args[i]] = true end
  local replayed = 0
  for _, raw in ipairs(redis.call('LRANGE', keys[2], 1, -1)) do
    local call = cjson.decode(raw)
    if not known[cjson.decode(call.args[7] .. '}').event_id] then
      local mapped = {}
      for i, key in ipairs(call.keys) do
        mapped[i] = staged(key)
        if i > KEYS_BEFORE then
          live[key] = true
          if (i - KEYS_BEFORE) % KEYS_PER_PERIOD == 0 then counters[key] = true end
        elseif i > 2 then
          live[key] = true
        end
      end
      replay(mapped, call.args)
      replayed = replayed + 1
    end
  end
  for key in pairs(counters) do
    local now = tonumber(redis.call('GET', key) or '0')
    if now > tonumber(redis.call('GET', staged(key)) or '0') then return {'behind', key} end
  end
  for key in pairs(live) do
    local from = staged(key)
    if redis.call('EXISTS', from) == 1 then
      redis.call('RENAME', from, key)
    else
      redis.call('DEL', key)
    end
  end
  redis.call('DEL', keys[1], keys[2])
  return {'ok', replayed}
end

--[[
A user's place in one view and the entries around it, read in one step (API.md section 5, the
standing read). KEYS: the view, the board's display names. ARGV: user, how many entries either
side. Returns {} if the user has no score in the view;
else {its 0-based position, its composite, the view's size, the entries as member, composite,
member, composite..., their display names (nil where none)}.
]]
local function standing(keys, args)
  local user, around = args[1], tonumber(args[2])
  local position = redis.call('ZREVRANK', keys[1], user)
  if not position then return {} end
  local rows = redis.call('ZREVRANGE', keys[1], math.max(position - around, 0),
                          position + around, 'WITHSCORES')
  local members = {}
  for i = 1, #rows, 2 do members[#members + 1] = rows[i] end
  local names = redis.call('HMGET', keys[2], unpack(members))
  return {position, redis.call('ZSCORE', keys[1], user), redis.call('ZCARD', keys[1]), rows,
          names}
end

redis.register_function('ladder_submit_v1', submit)
redis.register_function('ladder_take_v1', take)
redis.register_function('ladder_write_v1', write)
redis.register_function('ladder_put_v1', put)
redis.register_function('ladder_award_v1', award)
redis.register_function('ladder_contribute_v1', contribute)
redis.register_function('ladder_hot_add_v1', hot_add)
redis.register_function('ladder_hot_trim_v1', hot_trim)
redis.register_function('ladder_replay_v1', replay)
redis.register_function('ladder_rebuild_begin_v1', rebuild_begin)
redis.register_function('ladder_rebuild_extend_v1', rebuild_extend)
redis.register_function('ladder_rebuild_finish_v1', rebuild_finish)
redis.register_function('ladder_rebuild_abort_v1', rebuild_abort)
redis.register_function{function_name = 'ladder_standing_v1', callback = standing,
                        flags = {'no-writes'}}

--[[
The atomic write of one accepted score (docs/api.md section 4; docs/architecture.md, invariant 1).

One call: check the idempotency record and the outbox bound; compute the new score of every
period's regional board and team board (refusing the whole call if any leaves its encodable
range); write them with their distinct-score sets (for dense ranks); read rank and previous rank;
name whoever this write pushed out of each notify bracket; count the period's players and events;
record the answer under the event id; append the event to the feed and the outbox; journal the
call while the board is being rebuilt. Every key shares one hash tag.

KEYS: idem, outbox, rebuild flag, rebuild journal (the write's own keys: a replay gets scratch
      keys for them), names, feed, user regions, user team; then seven per period: regional
      board, its distinct set, regions set, team board, its distinct set, players (HyperLogLog),
      event count. shared/submit.py builds them.
ARGV: 1 body hash, 2 operator, 3 value, 4 user_id, 5 region, 6 display_name ('' for none),
      7 the event as JSON without its closing brace, 8 period count, 9 idempotency ttl,
      10 outbox max, 11 brackets (comma-separated), 12 '1' descending / '0' ascending,
      13 feed length, 14 team_id ('' for none),
      then six per period: name, id, scale (2^time bits), tick, max score, expire-at (0: never).
Returns {status, payload}: ok / duplicate with the outbox entry, conflict, range, outbox_full.
]]

local KEYS_BEFORE, KEYS_PER_PERIOD, ARGS_BEFORE, ARGS_PER_PERIOD = 8, 7, 14, 6

-- The answer already stored under the event id, or the outbox bound; nil: the write goes on.
local function refusal(keys, args)
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
  return nil
end

-- What every period's write needs to know of the event and its board.
local function event_of(args)
  local desc = args[12] == '1'
  local e = {op = args[2], value = tonumber(args[3]), user = args[4], region = args[5],
             display = args[6], team = args[14], desc = desc, sign = desc and 1 or -1,
             brackets = {}}
  e.teams = e.op == 'incr' and e.team ~= ''
  for t in string.gmatch(args[11], '%d+') do e.brackets[#e.brackets + 1] = tonumber(t) end
  return e
end

-- The i-th period's arguments and keys.
local function period_of(keys, args, i)
  local a, k = ARGS_BEFORE + (i - 1) * ARGS_PER_PERIOD, KEYS_BEFORE + (i - 1) * KEYS_PER_PERIOD
  return {name = args[a + 1], id = args[a + 2], scale = tonumber(args[a + 3]),
          tick = tonumber(args[a + 4]), max = tonumber(args[a + 5]),
          expire = tonumber(args[a + 6]),
          board = keys[k + 1], distinct = keys[k + 2], regions = keys[k + 3],
          teams = keys[k + 4], teams_distinct = keys[k + 5], players = keys[k + 6],
          events = keys[k + 7]}
end

-- The new score under the board's operator from the old one (nil: none), and whether it changed.
local function new_score(e, old_score)
  if e.op == 'incr' then
    return (old_score or 0) + e.value, old_score == nil or e.value ~= 0
  elseif e.op == 'best' then
    if old_score == nil or (e.desc and e.value > old_score)
        or ((not e.desc) and e.value < old_score) then
      return e.value, true
    end
    return old_score, false
  end
  return e.value, old_score == nil or e.value ~= old_score
end

local function out_of_range(p, what, score)
  if score > p.max or score < -p.max then
    return {'range', p.name .. what .. ' would be ' .. fmt(score) ..
            ', beyond the largest encodable ' .. fmt(p.max)}
  end
  return nil
end

-- First pass, for one period: its new scores, before anything is written. Returns a refusal if
-- one would leave the encodable range, else nil.
local function plan_period(e, p)
  local old = redis.call('ZSCORE', p.board, e.user)
  if old then p.old_signed = signed_of(old, p.scale) end
  p.score, p.changed = new_score(e, p.old_signed and p.old_signed * e.sign)
  local refused = out_of_range(p, ' score', p.score)
  if refused or not e.teams then return refused end
  local old_team = redis.call('ZSCORE', p.teams, e.team)
  if old_team then p.team_old_signed = signed_of(old_team, p.scale) end
  p.team_score = (p.team_old_signed or 0) * e.sign + e.value
  return out_of_range(p, ' team score', p.team_score)
end

-- The members whose rank a move from prev (0-based, false: absent) to rank (1-based) pushed
-- below each bracket it crossed, by bracket.
local function pushed_out(brackets, board, rank, prev)
  local pushed = {}
  for _, t in ipairs(brackets) do
    if rank <= t and (prev == false or prev + 1 > t) then
      local out = redis.call('ZREVRANGE', board, t, t)
      if out[1] then pushed[tostring(t)] = out[1] end
    end
  end
  return pushed
end

-- put_entry() into one of the period's views (its board or team board), at the period's tick.
local function put_in_period(e, p, view, distinct, member, score, old_signed)
  local signed, reached = score * e.sign, p.scale - 1 - p.tick
  local added = put_entry(view, distinct, member, signed * p.scale + reached, old_signed, signed,
                          p.scale)
  -- A member new to the view may be its first: then the view's keys were just made.
  expire_made(added == 1 and redis.call('ZCARD', view) == 1, {view, distinct}, p.expire)
end

-- Second pass, for one period: write, and read what the write did.
local function write_period(e, p)
  local prev = redis.call('ZREVRANK', p.board, e.user)
  local rank
  if p.changed then
    put_in_period(e, p, p.board, p.distinct, e.user, p.score, p.old_signed)
    rank = redis.call('ZREVRANK', p.board, e.user) + 1
  else
    rank = prev + 1
  end
  if e.teams and (p.team_old_signed == nil or e.value ~= 0) then
    put_in_period(e, p, p.teams, p.teams_distinct, e.team, p.team_score, p.team_old_signed)
  end
  expire_made(redis.call('SADD', p.regions, e.region) == 1, {p.regions}, p.expire)
  -- Every write of the period adds to both, so the period's first write makes them.
  local first = redis.call('INCR', p.events) == 1
  redis.call('PFADD', p.players, e.user)
  expire_made(first, {p.players, p.events}, p.expire)
  local previous = cjson.null
  if prev then previous = prev + 1 end
  return {period_id = p.id, score = p.score, rank = rank, previous_rank = previous,
          improved = p.changed, pushed_out = pushed_out(e.brackets, p.board, rank, prev)}
end

-- What the write leaves beside the boards: the display name, the user's regions and team, the
-- feed, the answer under the event id and the outbox entry (returned); and, while a rebuild of
-- the board runs (rebuild.lua), the call itself in the journal.
local function record(keys, args, e, periods)
  if e.display ~= '' then redis.call('HSET', keys[5], e.user, e.display) end
  redis.call('SADD', keys[7], e.region)
  if e.team ~= '' then redis.call('HSET', keys[8], e.user, e.team) end
  local event = args[7] .. '}'
  local feed_length = tonumber(args[13])
  if redis.call('LPUSH', keys[6], event) > feed_length then
    redis.call('LTRIM', keys[6], 0, feed_length - 1)
  end
  local entry = args[7] .. ',"periods":' .. cjson.encode(periods) .. '}'
  redis.call('SET', keys[1], args[1] .. '\n' .. entry, 'EX', tonumber(args[9]))
  redis.call('XADD', keys[2], '*', 'e', entry)
  if redis.call('EXISTS', keys[3]) == 1 then
    redis.call('RPUSH', keys[4], cjson.encode({keys = keys, args = args}))
  end
  return entry
end

local function submit(keys, args)
  local refused = refusal(keys, args)
  if refused then return refused end
  local e = event_of(args)
  -- Every period is planned before any is written: a refusal writes nothing.
  local plan = {}
  for i = 1, tonumber(args[8]) do
    plan[i] = period_of(keys, args, i)
    refused = plan_period(e, plan[i])
    if refused then return refused end
  end
  local periods = {}
  for _, p in ipairs(plan) do periods[p.name] = write_period(e, p) end
  return {'ok', record(keys, args, e, periods)}
end

redis.register_function(FUNCTIONS.submit, submit)

--[[
The atomic write of one accepted score (docs/api.md section 4; docs/architecture.md, invariant 1).

One call keeps what the answer and the guarantees need, nothing more: check the idempotency
record and the outbox bound; compute the new score of every period's regional board (refusing
the whole call if any leaves the range of exact scores); write them with their
hashes of records (tie key, score, metadata; shared/ranking.py has the layout); read rank and
previous rank; name whoever this write pushed out of each notify bracket, and whoever a fall
moved into one (brackets.lua); record the answer under the event's board, user and id, its
"derive pending" mark set; note the event as the board's newest; append it to the outbox, each
changed period with the pair (score, subscore) its entry held before; journal the call while
the board is being rebuilt. Every key shares one hash tag.

What is derived from the event (the team boards, the feed, the period's players, events and
regions, the user's regions and team, and the regional boards' distinct-score sets where dense
reads asked for them) is the aggregator's: derive.lua applies it from the event stream. The call
still names those keys, so that a journaled call is replayed whole (the write, then the derive
step: rebuild.lua) onto staging, and the rebuild replaces each of them.

KEYS, in one of two layouts (shared/submit.py builds both):
  journaled: the event's record (its board, user and id), the record of the layout before (its
      board and id alone), outbox, rebuild flag, rebuild journal, newest event (the write's own
      keys: a replay gets scratch keys for them), names, feed, users' regions, user team; then
      nine per period: regional board, its distinct set, its tie keys, regions set, team board,
      its distinct set, its tie keys, players (HyperLogLog), event count. Last, the board's
      hidden users (absent from a journaled call of the version before: none hidden).
  lean: the keys the write touches, and no others: the event's record, the record of the layout
      before, outbox, rebuild flag, newest event, names; then three per period: regional board,
      its tie keys, regions set (written only by a user's first score on the regional board);
      last, the board's hidden users. A lean call cannot be journaled (a replay
      writes the derived views, which it does not name): while the board is being rebuilt it
      writes nothing and returns {'rebuilding', ''}, and the caller sends the journaled call.
      Every key a function is given costs Redis about as much as a command (its argument read,
      made an object, then a Lua string); the lean call is given 19 where the journaled one is
      given 47, on a board of four periods.
ARGV: 1 body hash, 2 operator, 3 value, 4 user_id, 5 region, 6 display_name ('' for none),
      7 the event as JSON without its closing brace, 8 period count, 9 idempotency ttl,
      10 outbox max, 11 brackets (comma-separated), 12 '1' descending / '0' ascending,
      13 feed length, 14 team_id ('' for none), 15 the event's tie key (its subscore part, then
      its time), 16 the largest score held exactly, 17 the metadata as JSON ('' for none),
      18 the board's subscore order ('desc', 'asc', '' for none), then three per period: name,
      id, expire-at (0: never).
Returns {status, payload}: ok / duplicate with the outbox entry, conflict, range, outbox_full,
expired (every period of the event is past its retention: nothing written), rebuilding (a lean
call only).
]]

local KEYS_BEFORE, KEYS_PER_PERIOD, ARGS_BEFORE, ARGS_PER_PERIOD = 10, 9, 18, 3

-- Seconds past an event's time beyond which its periods' keys are surely still there when it is
-- written: a day (the longest LADDER_ALLOWED_LATENESS) and a minute.
local SURELY_KEPT = 86400 + 60
-- A tie key's time part is this less the Unix ms it was reached at (shared/ranking.py tie_key).
local TIME_MAX = 2 ^ 48 - 1

-- The two layouts of KEYS (above): the keys before the periods', the keys of a period, where
-- among them the regional board's tie keys are, and where the names, the newest event and (a
-- journaled call only) the journal are. Both start with the record, the record of the layout
-- before, the outbox and the rebuild flag.
local JOURNALED = {before = KEYS_BEFORE, per = KEYS_PER_PERIOD, ties = 3, regions = 4, names = 7,
                   newest = 6, journal = 5}
local LEAN = {before = 6, per = 3, ties = 2, regions = 3, names = 6, newest = 5}

-- The event's record under its user and id (docs/architecture.md, "Idempotency"): a marks
-- byte (the consumers' seen bits, live.lua), the body hash, then the first answer, compactly:
-- per period its code (the name's initial, upper case if improved) and period id, then score,
-- rank and previous rank ('' for none) in base 36, ' ' between fields and ';' between periods.
-- Records under the id alone (ids per board, before the upgrade) answer until they expire: of
-- this layout, or of the first one (the hash in 32 hex digits, '\n', the outbox entry). One of
-- marks alone (a consumer saw the event after its answer expired) holds no answer.
-- A write's record starts with its derive-pending bit set (live.lua, MARKS_PENDING): the
-- aggregator's derive step clears it when it applies the event.
local MARKS_NEW = 'D'
local DIGITS = '0123456789abcdefghijklmnopqrstuvwxyz'

-- Base-36 numerals of 0 ... 1295: one or two digits as written (ONE), and two with a leading
-- zero (TWO), so that a number is written two digits a step. Made on the first call: while the
-- library loads, only `redis` is there (common.lua).
local ONE, TWO

local function numerals()
  ONE, TWO = {}, {}
  for i = 0, 1295 do
    local hi, lo = math.floor(i / 36), i % 36
    TWO[i] = string.sub(DIGITS, hi + 1, hi + 1) .. string.sub(DIGITS, lo + 1, lo + 1)
    ONE[i] = hi == 0 and string.sub(TWO[i], 2) or TWO[i]
  end
end

-- An integer (|n| < 2**53) in base 36, lower-case digits, no leading zero.
local function base36(n)
  if n < 0 then return '-' .. base36(-n) end
  if ONE == nil then numerals() end
  if n < 1296 then return ONE[n] end
  local low, k = {}, 0
  repeat
    local d = n % 1296
    k = k + 1
    low[k] = TWO[d]
    n = (n - d) / 1296
  until n < 1296
  local out = {ONE[n]}
  for i = k, 1, -1 do out[#out + 1] = low[i] end
  return table.concat(out)
end

-- One period's part of the compact answer (above).
local function compact_part(name, id, improved, score, rank, prev)
  local code = string.sub(name, 1, 1)
  if improved then code = string.upper(code) end
  return code .. id .. ' ' .. base36(score) .. ' ' .. base36(rank) .. ' ' ..
         (prev and base36(prev) or '')
end

-- The answer a record (its value; false: none) holds: (body hash, answer), or nil for none (no
-- record, or one of marks alone).
local function answer_in(stored)
  if not stored or #stored <= 1 then return nil end
  if string.byte(stored, 33) == 10 then  -- the layout before: its hash starts with ours
    return string.sub(stored, 1, 16), string.sub(stored, 34)
  end
  return string.sub(stored, 2, 17), string.sub(stored, 18)
end

-- The answer already stored for the event (its duplicate, or a conflict); nil for none.
-- An event id belongs to its board and user: the event's record is named by both (keys[1]).
-- A record of the layout before (keys[2]: ids per board, written before the upgrade) names no
-- user, so while one lasts it answers as it did: the same body (whose hash covers the user) a
-- duplicate, any other 409; a retry of an event accepted before the upgrade never counts twice.
local function answered(keys, args)
  -- Both in one command: the write's cost in commands stays as it was.
  local stored = redis.call('MGET', keys[1], keys[2])
  local hash, answer = answer_in(stored[1])
  if hash == nil then hash, answer = answer_in(stored[2]) end
  if hash == nil then return nil end
  if hash == args[1] then return {'duplicate', answer} end
  return {'conflict', ''}
end

-- The answer already stored, or the outbox bound; nil: the write goes on.
local function refusal(keys, args)
  local found = answered(keys, args)
  if found then return found end
  if redis.call('XLEN', keys[3]) >= tonumber(args[10]) then
    return {'outbox_full', ''}
  end
  return nil
end

-- One period's result as a member of the outbox entry's JSON object "periods" (shared/events.py
-- PeriodResult), built as a string, in one concatenation: every number an exact integer (cjson
-- writes 14 significant digits; a score has up to 16), and every string a period name, a period
-- id, a bracket or a user id, none of which holds a character JSON escapes (shared/events.py,
-- shared/periods.py). cjson.encode() and the gsub() that put the exact scores back cost about
-- 2 % more of a write's instructions (bench/phases/instructions.py). `pushed` and `more` are
-- JSON already (brackets.lua pushed_out(); previous_json() and pulled_in(), the result's last
-- members, each '' or starting with a comma).
local function period_json(name, id, score, rank, prev, improved, pushed, more)
  return '"' .. name .. '":{"period_id":"' .. id .. '","score":' .. fmt(score) .. ',"rank":' ..
         fmt(rank) .. ',"previous_rank":' .. (prev and fmt(prev) or 'null') .. ',"improved":' ..
         (improved and 'true' or 'false') .. ',"pushed_out":{' .. pushed .. '}' .. more .. '}'
end

-- What every period's write needs to know of the event and its board.
local function event_of(args)
  -- Only what the write reads: each field of this table costs every write, as every table does.
  local e = {op = args[2], value = tonumber(args[3]), user = args[4], region = args[5],
             display = args[6], sign = args[12] == '1' and 1 or -1, tie = args[15],
             at = tie_time(args[15]), sub = sub_of(args[15]), max = tonumber(args[16]),
             meta = args[17], sub_order = args[18], brackets = {}}
  -- Each bracket as a number then as its digits, which name it in the answer and go to Redis as
  -- they are (a number given to redis.call() is formatted on every call): one flat list.
  local brackets = e.brackets
  for t in string.gmatch(args[11], '%d+') do
    brackets[#brackets + 1] = tonumber(t)
    brackets[#brackets + 1] = t
  end
  return e
end

-- The i-th period's arguments and its regional board's keys, the only ones of the period the
-- write touches (a journaled call names the others for a replay: rebuild.lua derived_of). The
-- period is its board's view (common.lua view_of) too, with no distinct-score set: the derive
-- step keeps the regional board's, where dense reads asked for it.
local function period_of(keys, args, i, layout)
  local a, k = ARGS_BEFORE + (i - 1) * ARGS_PER_PERIOD, layout.before + (i - 1) * layout.per
  return {name = args[a + 1], id = args[a + 2], expire = tonumber(args[a + 3]),
          view = keys[k + 1], ties = keys[k + layout.ties], regions = keys[k + layout.regions]}
end

-- Whether the event's (value, subscore part) beats an entry's: a better score, or an equal one
-- with a greater subscore part (greater is better: shared/ranking.py).
local function beats(e, old)
  local signed = e.value * e.sign
  if signed ~= old.signed then return signed > old.signed end
  return e.sub > old.sub
end

-- The new score under the board's operator from the old entry (nil: none), whether the score
-- changed, the tie key the entry is reached at, and the metadata it keeps (docs/api.md section
-- 4). Each rule goes by when the events happened, not by the order they come in, so that late
-- events rank as if they had come in time (and a rebuild, replaying in another order, ranks
-- alike):
--   incr: a total is reached when its last increment happened, the later of the entry's time and
--     the event's (an increment of 0 too: it moves the entry's reach time, not its score); the
--     metadata is the latest event's by time;
--   best: a better pair replaces the entry; an equal one reached earlier (a late event) makes
--     the entry reached then, its score unchanged (not improved); the metadata is that of the
--     event that reached the best first (one that improved, or a late equal one that moved it);
--   set: the latest event by time holds, with its metadata; one older than the entry's latest
--     write changes nothing. An equal pair keeps the entry's first reach time, for ties, and
--     its record that write's time (with_written()), against which lateness is judged.
-- A late event (events may come up to the allowed lateness after they happened) is one
-- reached_before() the entry it is written to (on set boards, written before: written_of()); it
-- leaves the entry's metadata.
local function new_score(e, old)
  if old == nil then return e.value, true, e.tie, e.meta end
  local old_score, late = old.signed * e.sign, e.at > tie_time(old.tie)
  if e.op == 'incr' then
    return old_score + e.value, e.value ~= 0, late and old.tie or e.tie,
           late and old.meta or e.meta
  elseif e.op == 'best' then
    if beats(e, old) then return e.value, true, e.tie, e.meta end
    local moved = late and e.value * e.sign == old.signed and e.sub == old.sub
    return old_score, false, moved and e.tie or old.tie, moved and e.meta or old.meta
  end
  if e.at > written_of(old) then return old_score, false, old.tie, old.meta end
  if e.value ~= old_score or e.sub ~= old.sub then return e.value, true, e.tie, e.meta end
  return old_score, false, old.tie, with_written(old.tie, e.tie, e.meta)
end

local function out_of_range(e, p, what, score)
  if score > e.max or score < -e.max then
    return {'range', p.name .. what .. ' would be ' .. fmt(score) ..
            ', beyond the largest exact score ' .. fmt(e.max)}
  end
  return nil
end

-- First pass, for one period: its new scores, before anything is written. Returns a refusal if
-- one would leave the range of exact scores, else nil.
local function plan_period(e, p)
  p.old = entry_in(p, e.user)
  p.score, p.changed, p.tie, p.meta = new_score(e, p.old)
  -- An entry whose score stands but whose reach time moved (best: reached earlier; incr: by an
  -- increment of 0) moves too.
  p.moved = not p.changed and p.tie ~= p.old.tie
  return out_of_range(e, p, ' score', p.score)
end

-- put_entry() of the user's new score into the period's board, reached at p.tie. A user new to
-- the regional board names its region in the period's regions set, in this step: the period's
-- close reads its regions there (services/aggregator/closer.py), and on a board that declares
-- none a region whose events were all still on their way to the derive step (which adds each
-- event's region too) would be left out of the close. Once for each user and regional board:
-- a steady-state write adds nothing.
local function put_in_period(e, p)
  put_entry(p, e.user, p.old, p.score * e.sign, p.tie, p.meta)
  if p.old ~= nil then return end
  -- A user new to the board may be its first: then the board's keys were just made.
  expire_made(redis.call('ZCARD', p.view) == 1, {p.view, p.ties}, p.expire)
  expire_made(redis.call('SADD', p.regions, e.region) == 1, {p.regions}, p.expire)
end

-- The subscore a subscore part (shared/ranking.py sub_part: 's', then 14 hex digits of the
-- subscore shifted into 0 ... 2**54 - 2, inverted on 'asc') was made from, exactly: the part's
-- value may pass 2**53, so it is taken in two halves of 28 bits, and each step's result is an
-- integer a double holds exactly.
local function subscore_of(part, order)
  local hi = tonumber(string.sub(part, 2, 8), 16) * 268435456
  local lo = tonumber(string.sub(part, 9, 15), 16) + 1
  if order == 'asc' then return (9007199254740992 - hi) - lo end
  return (hi - 9007199254740992) + lo
end

-- What a period's outbox result says of the entry before a write that changed it: its score
-- and subscore (the derive step keeps the distinct-score set by both pairs, derive.lua), as
-- members of the result's JSON object ('' for none).
local function previous_json(e, p)
  if not (p.changed and p.old) then return '' end
  local previous = ',"previous_score":' .. fmt(p.old.signed * e.sign)
  if p.old.sub ~= '' then
    previous = previous .. ',"previous_subscore":' .. fmt(subscore_of(p.old.sub, e.sub_order))
  end
  return previous
end

-- Second pass, for one period: write, and read what the write did; returns the period's result
-- as JSON (period_json()) and as its part of the compact answer. A hidden user's entry
-- (shared/lua/hide.lua) is its record alone: its member is put in the view for the length of
-- this atomic call, so that its answer holds the rank it would have, then taken out again; it
-- pushes nobody out of a bracket, nor moves anybody into one (e.brackets is empty).
local function write_period(e, p)
  local prev = false
  if p.old then
    prev = redis.call('ZREVRANK', p.view, p.old.member)
    -- A hidden user's member is kept out of the view, and a user just shown may not have its
    -- member back yet (shared/hidden.py puts them back view by view): its record says where.
    if not prev then
      redis.call('ZADD', p.view, fmt(p.old.signed), p.old.member)
      prev = redis.call('ZREVRANK', p.view, p.old.member)
    end
  end
  local rank
  if p.changed or p.moved then
    put_in_period(e, p)
    rank = redis.call('ZREVRANK', p.view, p.tie .. e.user) + 1
  else
    rank = prev + 1
    -- An unchanged entry keeps its place; it may take the write's metadata (new_score()).
    if p.old.meta ~= p.meta then
      redis.call('HSET', p.ties, e.user, record_of(p.old.tie, p.old.signed, p.meta))
    end
  end
  local pushed, more = pushed_out(e, p.view, rank, prev), previous_json(e, p)
  -- A fall moves up whoever it passes (brackets.lua pulled_in()).
  if prev and rank > prev + 1 then more = more .. pulled_in(e, p.view, rank, prev) end
  if e.hidden then
    local now = p.old
    if p.changed or p.moved then now = entry_in(p, e.user) end
    redis.call('ZREM', p.view, now.member)
  end
  prev = prev and prev + 1
  return period_json(p.name, p.id, p.score, rank, prev, p.changed, pushed, more),
         compact_part(p.name, p.id, p.changed, p.score, rank, prev)
end

-- The event id that the event's JSON (shared/submit.py) starts with; ids hold no '"'.
local function event_id_of(json) return string.match(json, '^{"event_id":"([^"]*)"') end

-- The event's identity within its board (shared/keys.py event_ref): '<event_id>:<user_id>', an
-- event id holding no ':'.
local function event_ref(json, user) return event_id_of(json) .. ':' .. user end

-- What the write leaves beside the boards: the display name (reads show it beside each entry;
-- one HSET, and the rebuild restores it as it restores the boards), the answer under the event's
-- user and id, the event's identity as the board's newest (the rebuild waits for it:
-- rebuild.lua) and the outbox entry (returned); and, while a rebuild of the board runs
-- (rebuild.lua), the call itself in the journal (a journaled call: a lean one returned before).
-- `results` and `answers` hold each period's JSON and compact answer (write_period()).
local function record(keys, args, e, results, answers, layout)
  if e.display ~= '' then redis.call('HSET', keys[layout.names], e.user, e.display) end
  local entry = args[7] .. ',"periods":{' .. table.concat(results, ',') .. '}}'
  redis.call('SET', keys[1], MARKS_NEW .. args[1] .. table.concat(answers, ';'), 'EX', args[9])
  redis.call('SET', keys[layout.newest], event_ref(args[7], e.user))
  redis.call('XADD', keys[3], '*', 'e', entry)
  if layout.journal and redis.call('EXISTS', keys[4]) == 1 then
    redis.call('RPUSH', keys[layout.journal], cjson.encode({keys = keys, args = args}))
  end
  return entry
end

-- submit() of a call in `layout` (JOURNALED or LEAN).
local function submit(keys, args, layout)
  local named = layout.before + tonumber(args[8]) * layout.per
  -- Keys of the other layout would be read as this one's, and the wrong keys written. (A
  -- journaled call of the version before names no hidden users' key.)
  if #keys ~= named + 1 and not (layout.journal and #keys == named) then
    return redis.error_reply('ERR submit() given ' .. #keys .. ' keys, not those of its layout')
  end
  local refused = refusal(keys, args)
  if refused then return refused end
  -- The one check of the rebuild flag a lean call makes; a journaled call makes it in record().
  if not layout.journal and redis.call('EXISTS', keys[4]) == 1 then return {'rebuilding', ''} end
  local e = event_of(args)
  local hidden = keys[named + 1]
  if hidden and redis.call('SISMEMBER', hidden, e.user) == 1 then
    e.hidden, e.brackets = true, {}
  end
  -- Every period is planned before any is written: a refusal writes nothing. A period whose
  -- keys have expired already (a late event past the period's retention) is left out: an
  -- EXPIREAT in the past would delete the keys it writes, and it keeps no view to count in.
  -- Only a period that expires within the longest lateness of the event's time can have; the
  -- clock is read for those alone.
  local plan, now = {}, nil
  for i = 1, tonumber(args[8]) do
    local p = period_of(keys, args, i, layout)
    if p.expire ~= 0 and p.expire <= (TIME_MAX - e.at) / 1000 + SURELY_KEPT then
      now = now or tonumber(redis.call('TIME')[1])
    end
    if now == nil or p.expire == 0 or p.expire > now then
      plan[#plan + 1] = p
      refused = plan_period(e, p)
      if refused then return refused end
    end
  end
  if #plan == 0 then
    return {'expired', 'every period it counts toward is past its retention, its views gone'}
  end
  local results, answers = {}, {}
  for i, p in ipairs(plan) do results[i], answers[i] = write_period(e, p) end
  return {'ok', record(keys, args, e, results, answers, layout)}
end

local function submit_journaled(keys, args) return submit(keys, args, JOURNALED) end
local function submit_lean(keys, args) return submit(keys, args, LEAN) end

redis.register_function(FUNCTIONS.submit_journaled, submit_journaled)
redis.register_function(FUNCTIONS.submit, submit_lean)

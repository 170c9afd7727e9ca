--[[
What the library's files share. shared/redis.py loads every file of shared/lua/ as ONE library,
in one FUNCTION LOAD, in a fixed order (this file first), so that loading stays atomic and a
file may use the local functions of the files before it. The loader puts FUNCTIONS before this
file: the name of each Redis Function, from shared/functions.py, keyed by the Lua function that
implements it; each file registers its functions as FUNCTIONS.<that key>. (While a library
loads, only `redis` is there: no pairs() or error(), hence one register_function call a line.)

Every key a function touches comes in KEYS, built by shared/keys.py: the Lua builds no key name.
A board's keys share its hash tag, so that each call stays in one hash slot.
]]

-- A number as Redis and the records take it. Every number Ladder formats is an integer well
-- within a C long (scores and their sums, ranks, times in ms), which '%d' writes exactly, and
-- several times cheaper than '%.17g' (whose digits a write's Lua formatted two dozen times).
local function fmt(n) return string.format('%d', n) end

-- Whether string a sorts before b as a sorted set orders members and Python orders str: byte by
-- byte, as memcmp. Lua's own < follows the server's collation locale, which need not be bytewise.
local function bytes_less(a, b)
  for i = 1, math.min(#a, #b) do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return #a < #b
end

-- The time part of a tie key as a number: its last 12 hex digits, whatever subscore part it
-- holds, greater for earlier (shared/ranking.py); 48 bits, exact in a Lua number. tonumber()
-- reads them in C, several times cheaper than comparing the digits byte by byte in Lua.
local function tie_time(tie) return tonumber(string.sub(tie, -12), 16) end

-- Whether tie key a was made from an earlier time than tie key b.
local function reached_before(a, b) return tie_time(a) > tie_time(b) end

-- The subscore part a tie key or member starts with: 's' and 14 hex digits on boards with a
-- subscore, '' on others (shared/ranking.py).
local function sub_of(raw)
  if string.byte(raw, 1) == 115 then return string.sub(raw, 1, 15) end
  return ''
end

-- The first position in [lo, hi) of a view whose member's subscore part is at most sub. Every
-- member there holds one score, so their members, and so subscore parts, descend.
local function first_not_above(view, lo, hi, sub)
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if sub_of(redis.call('ZREVRANGE', view, mid, mid)[1]) > sub then lo = mid + 1 else hi = mid end
  end
  return lo
end

-- How many members of a view rank above the pair (signed score, subscore part), and the
-- position past the last member holding its score.
local function above_pair(view, signed, sub)
  local k = fmt(signed)
  local above = redis.call('ZCOUNT', view, '(' .. k, '+inf')
  if sub == '' then return above, above + redis.call('ZCOUNT', view, k, k) end
  local past = above + redis.call('ZCOUNT', view, k, k)
  return first_not_above(view, above, past, sub), past
end

-- Whether any member of a view still holds the pair (signed score, subscore part).
local function held(view, signed, sub)
  if sub == '' then
    local k = fmt(signed)
    return redis.call('ZCOUNT', view, k, k) > 0
  end
  local at, past = above_pair(view, signed, sub)
  if at >= past then return false end
  return sub_of(redis.call('ZREVRANGE', view, at, at)[1]) == sub
end

-- The first member of a view, and its signed score, whose pair comes after the pair (signed
-- score, subscore part) in rank order: a lower score, or the same score and a smaller subscore
-- part (the members of a score descend by it); nil past the last. signed nil: the first member.
-- O(log n) a step, O(log² n) on boards with a subscore (a binary search among the score's).
local function next_pair(view, signed, sub)
  local rows
  if signed == nil then
    rows = redis.call('ZREVRANGE', view, 0, 0, 'WITHSCORES')
  else
    local k = fmt(signed)
    if sub ~= '' then
      local lo = redis.call('ZCOUNT', view, '(' .. k, '+inf')
      local past = lo + redis.call('ZCOUNT', view, k, k)
      local hi = past
      while lo < hi do
        local mid = math.floor((lo + hi) / 2)
        local at = sub_of(redis.call('ZREVRANGE', view, mid, mid)[1])
        if at >= sub then lo = mid + 1 else hi = mid end
      end
      if lo < past then rows = redis.call('ZREVRANGE', view, lo, lo, 'WITHSCORES') end
    end
    if rows == nil then
      rows = redis.call('ZREVRANGEBYSCORE', view, '(' .. k, '-inf', 'WITHSCORES', 'LIMIT', 0, 1)
    end
  end
  if rows[1] == nil then return nil, nil end
  return rows[1], tonumber(rows[2])
end

-- A member of a view's distinct-score set: one a distinct (score, subscore) pair, scored by the
-- signed score, so that equal scores order by subscore part (for dense ranks).
local function distinct_member(signed, sub) return sub .. fmt(signed) end

-- A user's regions as a field of the board's user-regions hash holds them (shared/keys.py
-- user_regions): the names, each once, joined by single spaces (a name holds none); {} for no
-- field. Most users have one region: their field is the name.
local function regions_in(field)
  if not field then return {} end
  if not string.find(field, ' ', 1, true) then return {field} end
  local list = {}
  for name in string.gmatch(field, '[^ ]+') do list[#list + 1] = name end
  return list
end

-- The field of the board's user-team hash (shared/keys.py user_team) that holds when the team in
-- a user's own field was given: the accepted_at of its event (RFC 3339 in milliseconds, UTC:
-- compares as text). A user id starts with a letter or digit, so no user's field begins '@'.
local function team_stamp(user) return '@' .. user end

-- A view's keys: the sorted set, its distinct-score set (nil where the caller keeps none: a
-- regional view's is the aggregator's derive step's, derive.lua), its hash of records.
local function view_of(view, distinct, ties)
  return {view = view, distinct = distinct, ties = ties}
end

-- An id's record in a view's hash (shared/ranking.py): tie key, signed score, metadata. On a
-- set board, an entry set again to the score it holds, after it reached it, keeps that write's
-- time beside its reach time, in the meta argument (with_written()).
local function record_of(tie, signed, meta) return tie .. '|' .. fmt(signed) .. '|' .. meta end

-- An id's entry in a view: {tie, member, signed, meta, sub}, or nil if it has none. A member is
-- the id's tie key then the id; the view's hash holds each id's record.
local function entry_in(v, id)
  local rec = redis.call('HGET', v.ties, id)
  if not rec then return nil end
  local tie, score, meta = string.match(rec, '^([^|]*)|([^|]*)|(.*)$')
  return {tie = tie, member = tie .. id, signed = tonumber(score), meta = meta, sub = sub_of(tie)}
end

-- The time part (tie_time()) of an entry's latest write on a set board (entry_in()): the one its
-- record keeps before the metadata (with_written()), or where none is kept its reach time. The
-- metadata is empty or a JSON object, '{' (123): a record says by that byte whether it keeps one.
local function written_of(entry)
  local first = string.byte(entry.meta, 1)
  if first == nil or first == 123 then return tie_time(entry.tie) end
  return tonumber(string.sub(entry.meta, 1, 12), 16)
end

-- A set entry's meta field for metadata meta, reached at tie key `tie` and last written at tie
-- key `at`'s time: that time, then '|', kept before the metadata only where it is not the reach
-- time (shared/ranking.py), so that a record of every other entry is as before.
local function with_written(tie, at, meta)
  local written = string.sub(at, -12)
  if written == string.sub(tie, -12) then return meta end
  return written .. '|' .. meta
end

-- Put an id's entry in a view at new_signed, reached at tie (a tie key), with metadata meta, in
-- place of old (its entry_in(), nil: none), keeping the view's hash of records and, where v has
-- one, its distinct-score set right: the new pair is added (a no-op if someone holds it
-- already), the old one removed once nobody holds it. Added before the old one goes, so the
-- distinct set is never emptied (and so deleted by Redis) while the view has members: the
-- three keys are made together, by a view's first member.
local function put_entry(v, id, old, new_signed, tie, meta)
  local member = tie .. id
  if old == nil or old.member ~= member or old.signed ~= new_signed then
    redis.call('ZADD', v.view, fmt(new_signed), member)
    if old ~= nil and old.member ~= member then redis.call('ZREM', v.view, old.member) end
  end
  redis.call('HSET', v.ties, id, record_of(tie, new_signed, meta))
  local sub = sub_of(tie)
  if v.distinct == nil or (old ~= nil and old.signed == new_signed and old.sub == sub) then
    return
  end
  redis.call('ZADD', v.distinct, fmt(new_signed), distinct_member(new_signed, sub))
  if old ~= nil and not held(v.view, old.signed, old.sub) then
    redis.call('ZREM', v.distinct, distinct_member(old.signed, old.sub))
  end
end

-- Take an id's entry (old, its entry_in()) out of a view, with its record and, once nobody
-- holds it, its pair in the distinct set.
local function remove_entry(v, id, old)
  redis.call('ZREM', v.view, old.member)
  redis.call('HDEL', v.ties, id)
  if v.distinct ~= nil and not held(v.view, old.signed, old.sub) then
    redis.call('ZREM', v.distinct, distinct_member(old.signed, old.sub))
  end
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

-- expire() of keys that have no expiry yet (EXPIREAT NX): those a write made, where the write
-- cannot tell cheaply which it made. A key keeps the expiry it was given first, as
-- expire_made() leaves it.
local function expire_new(keys, at)
  if at > 0 then
    for _, key in ipairs(keys) do redis.call('EXPIREAT', key, at, 'NX') end
  end
end

-- Whether a lease (lease.lua: a board's merge or snapshot lease) is held with `token`, its
-- whole value "<fence>|<owner>" (an owner names one process, so a token is never given twice).
-- The writes of a board's merge check it in the step that writes, so an aggregator that lost
-- the lease (paused past its time, then resumed) writes nothing after another took it over.
local function holds(lease, token)
  return redis.call('GET', lease) == token
end

local function fenced()
  return redis.error_reply('FENCED the board\'s merge lease is held by another aggregator')
end

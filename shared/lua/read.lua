-- The 0-based position of the first entry that comes after (signed, member) in rank order:
-- after the member's position while it still holds that score (one ZREVRANK), else after the
-- entries of better scores and, at the score, those whose member is not below the cursor's (it
-- moved or left, or the cursor was made up). Members of one score descend with their position,
-- so the latter is a binary search over that score's positions: O(log n) a step, O(log² n) in
-- all, however many entries tie and wherever the cursor points among them. No offset walk.
local function position_after(view, signed, member)
  local position = redis.call('ZREVRANK', view, member)
  if position and tonumber(redis.call('ZSCORE', view, member)) == signed then
    return position + 1
  end
  local k = fmt(signed)
  local lo = redis.call('ZCOUNT', view, '(' .. k, '+inf')
  local hi = lo + redis.call('ZCOUNT', view, k, k)
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if bytes_less(redis.call('ZREVRANGE', view, mid, mid)[1], member) then
      hi = mid
    else
      lo = mid + 1
    end
  end
  return lo
end

-- A hidden user's own read (ARGV 4 'self'; shared/lua/hide.lua): its record has no member in the
-- view, so it is placed where it would be, among the others as they are, and shown there: the
-- entries around it and the view's size as if it were in it.
local function standing_hidden(keys, user, around, tie, score)
  local member = tie .. user
  local position = position_after(keys[1], tonumber(score), member)
  local start = math.max(position - around, 0)
  local rows, stop = {}, position + around - 1
  if stop >= start then rows = redis.call('ZREVRANGE', keys[1], start, stop, 'WITHSCORES') end
  local at = 2 * (position - start) + 1
  table.insert(rows, at, score)
  table.insert(rows, at, member)
  local ids = {}
  for i = 1, #rows, 2 do ids[#ids + 1] = string.sub(rows[i], #tie + 1) end
  return {position, score, redis.call('ZCARD', keys[1]) + 1, rows,
          redis.call('HMGET', keys[3], unpack(ids)), redis.call('HMGET', keys[2], unpack(ids))}
end

--[[
A user's place in one view and the entries around it, read in one step (docs/api.md section 5,
the standing read). KEYS: the view, its hash of records, the board's display names. ARGV: user,
how many entries either side (and, for placed() below, the rank style and 'self' for the
user's own read). Returns {} if the user has no score in the view (or is hidden there, but to
itself); else {its 0-based position, its signed score, the view's size, the entries as member,
score, member, score..., their display names (nil where none), their records
(shared/ranking.py)}. A member is a tie key then the id.
]]
local function standing(keys, args)
  local user, around = args[1], tonumber(args[2])
  local rec = redis.call('HGET', keys[2], user)
  if not rec then return {} end
  local tie, score = string.match(rec, '^([^|]*)|([^|]*)|')
  local position = redis.call('ZREVRANK', keys[1], tie .. user)
  if not position then
    if args[4] == 'self' then return standing_hidden(keys, user, around, tie, score) end
    return {}
  end
  local rows = redis.call('ZREVRANGE', keys[1], math.max(position - around, 0),
                          position + around, 'WITHSCORES')
  local ids = {}
  for i = 1, #rows, 2 do ids[#ids + 1] = string.sub(rows[i], #tie + 1) end
  return {position, score, redis.call('ZCARD', keys[1]), rows,
          redis.call('HMGET', keys[3], unpack(ids)), redis.call('HMGET', keys[2], unpack(ids))}
end

-- The count behind a competition or dense rank on a board with a subscore: how many entries
-- (competition: a binary search over the positions of the score's entries) or distinct
-- (score, subscore) pairs (dense: the pair's ZREVRANK in the distinct set) rank strictly above
-- the pair (shared/ranking.py), which an entry of the view holds.
local function above_sub(view, distinct, style, signed, sub)
  if style == 'dense' then
    local pair = distinct_member(signed, sub)
    local rank = redis.call('ZREVRANK', distinct, pair)
    if rank then return rank end
    -- A pair not in the set yet: a regional set trails the writes by the aggregator's derive
    -- step (derive.lua). The pairs above it: those of better scores, and those of its score
    -- with a greater subscore part (greater members, as the set orders equal scores).
    local k = fmt(signed)
    local above = redis.call('ZCOUNT', distinct, '(' .. k, '+inf')
    for _, m in ipairs(redis.call('ZRANGEBYSCORE', distinct, k, k)) do
      if bytes_less(pair, m) then above = above + 1 end
    end
    return above
  end
  return (above_pair(view, signed, sub))
end

-- Distinct pairs a dense read counts by walking the view, at most, while the view has no
-- distinct-score set (docs/architecture.md, dense ranks on demand).
local DENSE_WALK = 1000

-- How many distinct pairs of the view rank strictly above the pair (signed, sub), walked pair
-- by pair from the top (next_pair()); nil past DENSE_WALK of them.
local function walked_above(view, signed, sub)
  local count, m, s = 0, next_pair(view, nil, nil)
  while m do
    local p = sub_of(m)
    if s < signed or (s == signed and p <= sub) then return count end
    count = count + 1
    if count > DENSE_WALK then return nil end
    m, s = next_pair(view, s, p)
  end
  return count
end

--[[
The count behind the style rank of an entry holding the pair (signed score, subscore part):
how many entries (competition) or distinct pairs (dense) rank strictly above it: a ZCOUNT on
the view or its distinct-score set, or above_sub() on boards with a subscore. false for
ordinal, whose rank is the position. Dense on a view without its distinct-score set (a global
view whose set is not built yet; the view has members, or nothing is counted): {the count},
walked, or {} if the walk would pass DENSE_WALK pairs.
]]
local function style_count(view, distinct, style, signed, sub)
  if style == 'ordinal' then return false end
  if style == 'dense' and redis.call('EXISTS', distinct) == 0 then
    local walked = walked_above(view, signed, sub)
    if walked == nil then return {} end
    return {walked}
  end
  if sub ~= '' then return above_sub(view, distinct, style, signed, sub) end
  local key = style == 'dense' and distinct or view
  return redis.call('ZCOUNT', key, '(' .. fmt(signed), '+inf')
end

-- Up to count rows (member, score, ...) that come after (signed, member) in rank order, and the
-- 0-based position of the first of them: a range by position from position_after().
local function after_cursor(view, signed, member, count)
  local first = position_after(view, signed, member)
  return redis.call('ZREVRANGE', view, first, first + count - 1, 'WITHSCORES'), first
end

-- The display names and records of rows' ids. A member is a tie key, then the id: 12 characters
-- of time part, after 15 of subscore part on boards with one (shared/ranking.py).
local function extras_of(names, ties, rows)
  local ids = {}
  for i = 1, #rows, 2 do
    local m = rows[i]
    ids[#ids + 1] = string.sub(m, (sub_of(m) == '' and 13 or 28))
  end
  return redis.call('HMGET', names, unpack(ids)), redis.call('HMGET', ties, unpack(ids))
end

--[[
A page of a view, best first, read in one step (docs/api.md section 5, the leaderboard read).
KEYS: the view, its hash of records, the board's display names, its distinct-score set, the
board's as_of hash. ARGV: limit, rank style, the cursor's signed score and member ('' for the
first page), 'names' if entries carry names and records (not on a team view), the as_of field
('' for a view whose as_of is the time of the read). Returns {the view's size, the 0-based
position of the first row, the rows as member, score..., whether more follow (0 or 1), their
display names, their records (both {} without 'names'), the first row's style_count(), as_of}.
]]
local function page(keys, args)
  local limit, style = tonumber(args[1]), args[2]
  local rows, first
  if args[3] == '' then
    rows, first = redis.call('ZREVRANGE', keys[1], 0, limit, 'WITHSCORES'), 0
  else
    rows, first = after_cursor(keys[1], tonumber(args[3]), args[4], limit + 1)
  end
  local more = 0
  if #rows > 2 * limit then
    more = 1
    table.remove(rows)
    table.remove(rows)
  end
  local names, records, count = {}, {}, false
  if #rows > 0 then
    if args[5] == 'names' then names, records = extras_of(keys[3], keys[2], rows) end
    count = style_count(keys[1], keys[4], style, tonumber(rows[2]), sub_of(rows[1]))
  end
  local as_of = false
  if args[6] ~= '' then as_of = redis.call('HGET', keys[5], args[6]) end
  return {redis.call('ZCARD', keys[1]), first, rows, more, names, records, count, as_of}
end

--[[
A user's place in one view with the entries around it and the counts of its style rank, read in
one step (the standing read). KEYS: the view, its hash of records, the board's display names, its
distinct-score set, and optionally the board's as_of hash. ARGV: user, how many entries either
side, rank style, 'self' where the reader is the user (a hidden user's own read answers:
standing_hidden()) or '', and optionally the as_of field ('' or none: not read). Returns {} if
the user has no score in the view; else standing()'s reply, then the style_count() of the user's
entry and of the first entry around it, then the as_of field's value (false: not read or unset).
]]
local function placed(keys, args)
  local found = standing(keys, args)
  if #found == 0 then return found end
  found[9] = false
  if keys[5] and args[5] and args[5] ~= '' then found[9] = redis.call('HGET', keys[5], args[5]) end
  local rows, style = found[4], args[3]
  local own = 2 * (found[1] - math.max(found[1] - tonumber(args[2]), 0)) + 1
  found[7] = style_count(keys[1], keys[4], style, tonumber(rows[own + 1]), sub_of(rows[own]))
  found[8] = found[7]
  if own ~= 1 then
    found[8] = style_count(keys[1], keys[4], style, tonumber(rows[2]), sub_of(rows[1]))
  end
  return found
end

--[[
A friends scope's group read in one step (docs/api.md section 5): the records in the global
view and the display names of the owner and its friends, whose ids the caller read from the
owner's friend set first (a key of the user, not of the board: invariant 6 keeps it out of this
call). KEYS: the global view's hash of records, the board's display names, the board's as_of
hash. ARGV: the as_of field ('' for none), then the ids. Returns {their records (nil where the
id has no entry), their display names, as_of}. Ranking them is the caller's: a record holds the
entry's tie key and signed score (shared/ranking.py).
]]
local function friends(keys, args)
  local ids = {unpack(args, 2)}
  local as_of = false
  if args[1] ~= '' then as_of = redis.call('HGET', keys[3], args[1]) end
  if #ids == 0 then return {{}, {}, as_of} end -- a hidden owner, read by another, alone
  return {redis.call('HMGET', keys[1], unpack(ids)), redis.call('HMGET', keys[2], unpack(ids)),
          as_of}
end

redis.register_function{function_name = FUNCTIONS.standing, callback = standing,
                        flags = {'no-writes'}}
redis.register_function{function_name = FUNCTIONS.page, callback = page,
                        flags = {'no-writes'}}
redis.register_function{function_name = FUNCTIONS.placed, callback = placed,
                        flags = {'no-writes'}}
redis.register_function{function_name = FUNCTIONS.friends, callback = friends,
                        flags = {'no-writes'}}

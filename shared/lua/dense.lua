--[[
A view's distinct-score set built from the view (with merge.lua's batched()), a bounded step a
call, while the view's writer keeps it up to date: the merge for a global view (merge.lua's
kept_distinct(): the set being built follows every change the merge makes from the first step
on), the aggregator's derive step for a regional one (derive.lua's sync_pairs(), by each event's
pairs after its write). So each step
only adds the pairs that entries hold now; a pair whose last holder leaves is taken out by
that writer, or by the erasure that took the entry out (erase.lua). When the walk passes the last pair, the set is renamed to the view's distinct set,
which reads then use.

KEYS: the view, its distinct set, the set being built, the board's build set, the board's merge
lease (shared/keys.py). ARGV: expire-at (0: never), the view's member of the build set, the
cursor (the last pair added: signed score and subscore part; '' and '' to start), how many
members to take, the token the caller holds the lease with. Returns the cursor to go on from, or
{} once done (the build set then no longer names the view); an error (FENCED) if the lease is
not held with that token.
]]
local function dense_build(keys, args)
  if not holds(keys[5], args[6]) then return fenced() end
  local view, distinct, building = keys[1], keys[2], keys[3]
  local at, count = tonumber(args[1]), tonumber(args[5])
  if redis.call('EXISTS', distinct) == 1 then -- done before, or a new view's, made by the merge
    redis.call('DEL', building)
    redis.call('SREM', keys[4], args[2])
    return {}
  end
  local signed, sub = nil, nil
  -- A cursor goes on only with the set it was building: every step before the last leaves one.
  -- A set that went meanwhile (a rebuild put a new view in place and dropped it) starts again
  -- from the top.
  if args[3] ~= '' and redis.call('EXISTS', building) == 1 then
    signed, sub = tonumber(args[3]), args[4]
  end
  local added, finished = {}, false
  local first = redis.call('ZREVRANGE', view, 0, 0)[1]
  if first == nil then
    finished = true
  elseif sub_of(first) == '' then
    -- No subscores: a pair is a score; the rows of a range, many entries a step. The rest of
    -- the last score's entries, beyond the range, hold the same pair.
    local top = '+inf'
    if signed ~= nil then top = '(' .. fmt(signed) end
    local rows = redis.call('ZREVRANGEBYSCORE', view, top, '-inf', 'WITHSCORES', 'LIMIT', 0, count)
    for i = 2, #rows, 2 do
      local s = tonumber(rows[i])
      if s ~= signed then
        signed = s
        added[#added + 1] = rows[i]
        added[#added + 1] = distinct_member(s, '')
      end
    end
    sub = ''
    finished = #rows < 2 * count
  else
    for _ = 1, count do
      local m, s = next_pair(view, signed, sub)
      if m == nil then
        finished = true
        break
      end
      signed, sub = s, sub_of(m)
      added[#added + 1] = fmt(s)
      added[#added + 1] = distinct_member(s, sub)
    end
  end
  if #added > 0 then
    batched('ZADD', building, added)
    expire({building}, at)
  end
  if not finished then return {fmt(signed), sub} end
  if redis.call('EXISTS', building) == 1 then redis.call('RENAME', building, distinct) end
  redis.call('SREM', keys[4], args[2])
  return {}
end

redis.register_function(FUNCTIONS.dense_build, dense_build)

--[[
A user hidden on a board (a shadow ban, docs/api.md section 8b; docs/architecture.md, "Hidden
users"): its entry in a view is its record alone, in the view's hash (shared/ranking.py), with no
member in the sorted set, so that every rank, count and page of the view closes up as if it were
not there, and nothing reads it but its own standing read. The write (write.lua) and the merge
(merge.lua) keep a hidden user's records up to date without putting its members back; this call
moves the members of views that exist already, either way.

KEYS: fours of a view, its hash of records, its distinct-score set, the distinct set being built
(shared/keys.py). ARGV: the user, 'hide' or 'show'. Returns how many views changed.

Hiding takes the member out, and the pair (score, subscore) out of the distinct sets once nobody
else holds it; showing puts the member back from the record, and its pair into the distinct sets
that exist (a set that does not exist yet is built from the view when a dense read asks).
]]
local function hide(keys, args)
  local user, showing, changed = args[1], args[2] == 'show', 0
  for k = 1, #keys, 4 do
    local view, ties, distinct, building = keys[k], keys[k + 1], keys[k + 2], keys[k + 3]
    local rec = redis.call('HGET', ties, user)
    if rec then
      local tie, score = string.match(rec, '^([^|]*)|([^|]*)|')
      local signed, sub, member = tonumber(score), sub_of(tie), tie .. user
      if showing then
        -- The pair and the expiry too where the member is back already: a write of the user
        -- made since it was shown puts its member back (write.lua), not its pair.
        if redis.call('ZADD', view, fmt(signed), member) == 1 then changed = changed + 1 end
        local ttl = redis.call('PTTL', ties)
        if ttl > 0 and redis.call('PTTL', view) == -1 then redis.call('PEXPIRE', view, ttl) end
        for _, set in ipairs({distinct, building}) do
          if redis.call('EXISTS', set) == 1 then
            redis.call('ZADD', set, fmt(signed), distinct_member(signed, sub))
          end
        end
      elseif redis.call('ZREM', view, member) == 1 then
        changed = changed + 1
        if not held(view, signed, sub) then
          redis.call('ZREM', distinct, distinct_member(signed, sub))
          redis.call('ZREM', building, distinct_member(signed, sub))
        end
      end
    end
  end
  return changed
end

redis.register_function(FUNCTIONS.hide, hide)

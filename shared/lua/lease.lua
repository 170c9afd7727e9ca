--[[
A board's merge lease (shared/lease.py): one aggregator at a time merges a board
(and builds its distinct-score sets), so two aggregators never take, merge or drop each other's
dirty marks. The lease is a string "<fence>|<owner>", the holder's token, that expires unless
renewed; the fence is a counter of the board that goes up at every new holder, and the writes of
the merge check the token (common.lua's holds()), so a holder that lost the lease writes nothing
after it. lease_hold and lease_release serve a board's snapshot lease too, on keys of its own:
one history process at a time takes a board's snapshots (snapshot_take and snapshot_done,
below).

Take or renew. KEYS: the lease, the fence counter. ARGV: the owner, milliseconds to hold it.
Returns the token held, or '' while another owner holds the lease.
]]
local function lease_hold(keys, args)
  local held = redis.call('GET', keys[1])
  if held then
    local owner = string.match(held, '^%d+|(.*)$')
    if owner ~= args[1] then return '' end
    redis.call('PEXPIRE', keys[1], args[2])
    return held
  end
  local token = redis.call('INCR', keys[2]) .. '|' .. args[1]
  redis.call('SET', keys[1], token, 'PX', args[2])
  return token
end

redis.register_function(FUNCTIONS.lease_hold, lease_hold)

--[[
Give the lease up, if still held with this token. KEYS: the lease. ARGV: the token. Returns 1 if
it was given up, 0 if another holds it (or nobody does).
]]
local function lease_release(keys, args)
  if not holds(keys[1], args[1]) then return 0 end
  redis.call('DEL', keys[1])
  return 1
end

redis.register_function(FUNCTIONS.lease_release, lease_release)

--[[
Take the dirty marks of a board for a merge: the dirty set becomes the merging set, unless a
merging set is there already (a pass left it partway, or its holder died), which is then
merged first. Each rename counts one in the board's take counter: a close that marked a period's
users waits for a batch taken after that (services/aggregator/closer.py), without scanning the
sets. KEYS: the lease, the dirty set, the merging set, the take counter. ARGV: the token.
Returns {1 if there are marks to merge (0 if none), the take count}: the count names the batch
in the merging set (0 for one older than the counter), whose scan a merger goes on with across
passes only while the count stays the same. An error (FENCED) if the lease is not held with the
token.
]]
local function merge_take(keys, args)
  if not holds(keys[1], args[1]) then return fenced() end
  local takes = tonumber(redis.call('GET', keys[4]) or '0')
  if redis.call('EXISTS', keys[3]) == 1 then return {1, takes} end
  if redis.call('EXISTS', keys[2]) == 0 then return {0, takes} end
  redis.call('RENAME', keys[2], keys[3])
  return {1, redis.call('INCR', keys[4])}
end

redis.register_function(FUNCTIONS.merge_take, merge_take)

--[[
The start of a board's snapshot pass (services/history/snapshotter.py), under the board's
snapshot lease: the changed-views set becomes the set the pass takes, unless a set a pass cut
short left is there (taken first, the new marks after), and the take is given its time, which
every snapshot of the set is stored under. A set left by a pass cut short keeps the time it was
taken at, so the process that takes it over stores its views under the same time as the pass
before did: the history database's unique key on (board, scope, period, period id, time) then
stores each view's snapshot once, however many passes store it. A new take's time is the
caller's, or 1 ms after the board's last take if that is not later (clocks of two processes),
so two takes never share a time. KEYS: the lease, the changed-views set, the set the pass takes,
the board's take hash (fields taking: the time of the set being taken; last: of the last take).
ARGV: the token, the caller's time (ms). Returns the take's time in ms, 0 if there is nothing to
take, -1 if the lease is not held with the token.
]]
local function snapshot_take(keys, args)
  if not holds(keys[1], args[1]) then return -1 end
  if redis.call('EXISTS', keys[3]) == 1 then
    local at = redis.call('HGET', keys[4], 'taking')
    if at then return tonumber(at) end
    -- A set left by a release that kept no time: taken from now on as a new take.
  elseif redis.call('EXISTS', keys[2]) == 1 then
    redis.call('RENAME', keys[2], keys[3])
  else
    return 0
  end
  local at = tonumber(args[2])
  local last = tonumber(redis.call('HGET', keys[4], 'last') or '0')
  if at <= last then at = last + 1 end
  redis.call('HSET', keys[4], 'taking', fmt(at), 'last', fmt(at))
  return at
end

redis.register_function(FUNCTIONS.snapshot_take, snapshot_take)

--[[
The end of a board's snapshot pass, under the same lease: the follow-up marks go into the
board's changed-views set, the set the pass took and its time are deleted and the lease given
up, in one step, and only while the lease is held with the token. A pass that lost it (paused
past its time) deletes nothing: the set it took may be a later pass's by then. KEYS: the lease,
the set the pass took, the changed-views set, the board's take hash. ARGV: the token, then the
follow-up marks. Returns 1 if done, 0 if the lease is held by another (or nobody).
]]
local function snapshot_done(keys, args)
  if not holds(keys[1], args[1]) then return 0 end
  for i = 2, #args, 1000 do
    redis.call('SADD', keys[3], unpack(args, i, math.min(i + 999, #args)))
  end
  redis.call('DEL', keys[2], keys[1])
  redis.call('HDEL', keys[4], 'taking')
  return 1
end

redis.register_function(FUNCTIONS.snapshot_done, snapshot_done)

--[[
Award a badge exactly once (docs/api.md section 3): KEYS[1] the user's badges hash. ARGV badge,
awarded-at, channel, message. Records the badge and publishes the message in one step, so a
badge is pushed exactly when it is first recorded, however often its event is delivered.
Returns 1 if awarded now, 0 if the user had it already. A badge held already takes the earlier
time: events are not always handled in the order they were accepted (a message given back to
the queue, two notifiers on it), and the badge's time is that of the first event that earned
it. Times are RFC 3339 in UTC with milliseconds (shared/events.py rfc3339), all of one length,
so they compare as strings.
]]
local function award(keys, args)
  if redis.call('HSETNX', keys[1], args[1], args[2]) == 0 then
    local held = redis.call('HGET', keys[1], args[1])
    if args[2] < held then redis.call('HSET', keys[1], args[1], args[2]) end
    return 0
  end
  redis.call('PUBLISH', args[3], args[4])
  return 1
end

redis.register_function(FUNCTIONS.award, award)

--[[
The rank messages of a board's events, published and each event marked handled by the notifier
in one step (docs/architecture.md, "Idempotency"): the notifier's mark is the decision, as a
badge's HSETNX is, so an event's messages go out exactly once however often, and by however
many notifiers at once, it is delivered, and never an event marked whose messages did not go
out. The PUBLISHes are made from the board's node: on Redis Cluster they reach every node's
subscribers from there. KEYS: three an event (as seen's, live.lua). ARGV: the seen ttl, then an
event at a time its count of messages and each message's channel and body. Returns 1 for each
event whose messages went out now, 0 for one handled already.
]]
local function notify(keys, args)
  local ttl, a, out = tonumber(args[1]), 2, {}
  for i = 1, #keys, 3 do
    local n = tonumber(args[a])
    if was_seen(keys[i], keys[i + 1], keys[i + 2], 'notifier') then
      out[#out + 1] = 0
    else
      for j = a + 1, a + 2 * n, 2 do redis.call('PUBLISH', args[j], args[j + 1]) end
      mark_seen(keys[i], keys[i + 1], keys[i + 2], 'notifier', ttl)
      out[#out + 1] = 1
    end
    a = a + 1 + 2 * n
  end
  return out
end

redis.register_function(FUNCTIONS.notify, notify)

--[[
Undo what the notifier wrote for an event of a user erased, or a board deleted, while it handled
the event (services/notifier/late_erasures.py). KEYS[1] the user's badges hash on the board,
KEYS[2] the event's record. ARGV[1] the cut-off, as a badge's time. Every badge whose time is at
or before the cut-off goes (a badge's time is that of the event that earned it, and an event of
a fresh user, or of a fresh board of the name, is accepted after it), and the hash with the last;
the record only if it holds nothing but the notifier's mark, the record mark_seen makes for an
event with none (live.lua): one with more is the write's or the aggregator's, which the
erasure's pass or the aggregator's own look takes. Returns how many badges went.
]]
local function unaward(keys, args)
  local held, gone = redis.call('HGETALL', keys[1]), {}
  local notifier_only = string.char(64 + mask_of('notifier') + 2 ^ (7 - PENDING_BIT))
  for i = 1, #held, 2 do
    if held[i + 1] <= args[1] then gone[#gone + 1] = held[i] end
  end
  if #gone > 0 then redis.call('HDEL', keys[1], unpack(gone)) end
  if redis.call('GET', keys[2]) == notifier_only then redis.call('DEL', keys[2]) end
  return #gone
end

redis.register_function(FUNCTIONS.unaward, unaward)

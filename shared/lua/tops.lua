--[[
A view's top-10 push (services/aggregator/tops.py), decided and made in one step. The view's
fingerprint key holds "<version>|<fingerprint>" of the last top pushed (its version goes up at
every push); the caller reads it, then the view's top, and makes the message. The push goes out,
and the key takes the new fingerprint, only while the key still holds what the caller read:
another push in between (another aggregator's, of a top it may have read before this one) makes
the caller read the view again. So each push's top was read after the push before it went out,
and an older top never follows a newer one on the view's channel, however many aggregators
push it; the version makes a fingerprint that comes back (a top that changed and changed back)
another value. The PUBLISH is in the step: on Redis Cluster it reaches every node's subscribers
from the board's node. KEYS: the fingerprint key. ARGV: what the caller read there ('' for
nothing), the new fingerprint, the key's expiry (Unix seconds, 0: none), the channel, the
message. Returns 1 if pushed, 0 if another push came first.
]]
local function top_push(keys, args)
  local held = redis.call('GET', keys[1]) or ''
  if held ~= args[1] then return 0 end
  local version = tonumber(string.match(held, '^(%d+)|') or '0')
  redis.call('SET', keys[1], fmt(version + 1) .. '|' .. args[2])
  local expiry = tonumber(args[3])
  if expiry > 0 then redis.call('EXPIREAT', keys[1], expiry) end
  redis.call('PUBLISH', args[4], args[5])
  return 1
end

redis.register_function(FUNCTIONS.top_push, top_push)

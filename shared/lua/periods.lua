--[[
Close a period, exactly once (docs/api.md section 8b): KEYS[1] the period's close claim, KEYS[2]
the watermark of its kind (end of the latest closed period, Unix seconds), KEYS[3] the board's
period outbox (stream). ARGV: closed-at (RFC 3339), the claim's expiry (Unix seconds, 0: none),
the period's end (Unix seconds), the most entries the outbox keeps, the message's id, the
period.closed message ('' for a period nobody scored in: claimed, no message), then channel and
message pairs to publish (the WebSocket's period_closed). Claims, queues the message and
publishes in one step: a second aggregator, or a restart, that closes the same period finds the
claim and does nothing. A period that ends at or before the watermark is refused as well:
periods of a kind are claimed oldest first, each moving the watermark to its end in the step
that claims it, so it was closed, under this claim's name or another (the version before named
a season's claim by its id alone). The outbox keeps its newest entries up to its bound, exactly
(MAXLEN without ~: a close is rare, and trims one entry at a time once the outbox is full);
the oldest go, published or not. Returns {1, entries dropped} if closed now, {0, 0} if it had
been.
]]
local function close_period(keys, args)
  local ended = tonumber(args[3])
  local mark = tonumber(redis.call('GET', keys[2]) or '0')
  if ended <= mark then return {0, 0} end
  if not redis.call('SET', keys[1], args[1], 'NX') then return {0, 0} end
  local expiry = tonumber(args[2])
  if expiry > 0 then redis.call('EXPIREAT', keys[1], expiry) end
  redis.call('SET', keys[2], args[3])
  local dropped = 0
  if args[6] ~= '' then
    local before = redis.call('XLEN', keys[3])
    redis.call('XADD', keys[3], 'MAXLEN', args[4], '*', 'm', args[6], 'i', args[5])
    dropped = before + 1 - redis.call('XLEN', keys[3])
  end
  for i = 7, #args - 1, 2 do
    redis.call('PUBLISH', args[i], args[i + 1])
  end
  return {1, dropped}
end

redis.register_function(FUNCTIONS.close_period, close_period)

--[[
Park a deleted board's period outbox (docs/api.md section 8b): KEYS[1] the board's period outbox,
KEYS[2] the key it is parked under, which the deletion leaves to the period relay. An outbox that
holds no entry is removed (v2: it was left, and the deletion unlinked it later, when a close may
have queued a message in it since). The outbox is renamed, its consumer group and
pending entries with it; where the parked key is there already (a second pass of the same
deletion), the outbox's entries are appended to it and the outbox removed. Returns the number of
entries parked.
]]
local function park_periods(keys, args)
  local waiting = redis.call('XLEN', keys[1])
  if waiting == 0 then
    redis.call('DEL', keys[1])
    return 0
  end
  if redis.call('EXISTS', keys[2]) == 0 then
    redis.call('RENAME', keys[1], keys[2])
    return waiting
  end
  for _, entry in ipairs(redis.call('XRANGE', keys[1], '-', '+')) do
    redis.call('XADD', keys[2], '*', unpack(entry[2]))
  end
  redis.call('DEL', keys[1])
  return waiting
end

--[[
Remove a parked period outbox once it holds no entry (every message of it confirmed): KEYS[1]
the parked key. Returns 1 if removed (or gone already), 0 if entries still wait in it.
]]
local function drop_parked(keys, args)
  if redis.call('XLEN', keys[1]) > 0 then return 0 end
  redis.call('DEL', keys[1])
  return 1
end

redis.register_function(FUNCTIONS.park_periods, park_periods)
redis.register_function(FUNCTIONS.drop_parked, drop_parked)

--[[
Mark an entry of a period outbox as being published, if it is still there as read: KEYS[1] the
outbox (a board's, or a deleted board's parked one), KEYS[2] its publishing marks (a hash: entry id
to the time, ms, the mark lapses). ARGV: the entry's id, how long the mark holds (ms; longer than a
publish may take). An entry an erasure replaced since it was read (erase_period_messages, below)
is gone: it is not to be published, its rewriting goes out in its place. The relay removes the
mark after the entry (confirmed) or alone (not published). Returns 1 if marked, 0 if gone.
]]
local function publishing_period(keys, args)
  if #redis.call('XRANGE', keys[1], args[1], args[1]) == 0 then return 0 end
  local now = redis.call('TIME')
  local lapses = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000) + tonumber(args[2])
  redis.call('HSET', keys[2], args[1], lapses)
  redis.call('PEXPIRE', keys[2], args[2])
  return 1
end

redis.register_function(FUNCTIONS.publishing_period, publishing_period)

--[[
Rewrite period.closed messages still waiting in a period outbox without an erased user, atomically
with respect to the relay, which reads, marks, publishes and then deletes an entry: KEYS[1] the
outbox (a board's, or a deleted board's parked one), KEYS[2] its publishing marks
(publishing_period, above). ARGV: triples of an entry's id, its message as read, and its message
rewritten ('' for none: the entry goes). An entry still there with that message is replaced by one
at the end of the stream, of the same fields but the message; an entry gone meanwhile (published)
or changed is left alone, and so is one being published (marked, the mark not lapsed): the broker
may be taking it, and its rewriting would follow it under the same message_id, which consumers
drop as a copy. An entry deleted while pending is acknowledged by the relay's next read. Returns
the number of entries replaced or removed, and the number left alone as being published.
]]
local function erase_period_messages(keys, args)
  local done, busy = 0, 0
  local now = redis.call('TIME')
  local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
  for i = 1, #args - 2, 3 do
    local found = redis.call('XRANGE', keys[1], args[i], args[i])
    local lapses = tonumber(redis.call('HGET', keys[2], args[i]) or '0')
    if #found == 1 and lapses > now_ms then
      busy = busy + 1
    elseif #found == 1 then
      local fields, copy, same = found[1][2], {}, false
      for f = 1, #fields, 2 do
        if fields[f] == 'm' then
          same = fields[f + 1] == args[i + 1]
          table.insert(copy, 'm')
          table.insert(copy, args[i + 2])
        else
          table.insert(copy, fields[f])
          table.insert(copy, fields[f + 1])
        end
      end
      if same then
        if args[i + 2] ~= '' then redis.call('XADD', keys[1], '*', unpack(copy)) end
        redis.call('XDEL', keys[1], args[i])
        done = done + 1
      end
    end
  end
  return {done, busy}
end

redis.register_function(FUNCTIONS.erase_period_messages, erase_period_messages)

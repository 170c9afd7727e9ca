--[[
A user's global entry from its regional ones, as the merge (merge.lua) makes it: combine() in
services/aggregator/combine.py is the reference, and the tests hold this to it.
]]

local B32 = 4294967296
local HI = 2097152 -- 2**21: |total| <= 2**53 - 1 = (2**21 - 1) * 2**32 + (2**32 - 1)
local MAX_SCORE = 9007199254740991 -- 2**53 - 1 (shared/ranking.py), a double exactly

-- The exact sum of signed scores, each within +-(2**53 - 1); past that range, the end of the
-- range on the sum's side, and true. Doubles add integers exactly only below 2**53: each score is
-- split at 2**32, and the parts summed.
local function exact_sum(entries)
  local hi, lo = 0, 0
  for _, e in ipairs(entries) do
    local h = math.floor(e.signed / B32)
    hi, lo = hi + h, lo + (e.signed - h * B32)
  end
  local carry = math.floor(lo / B32)
  hi, lo = hi + carry, lo - carry * B32 -- now 0 <= lo < 2**32
  if hi >= HI then return MAX_SCORE, true end
  if hi < -HI or (hi == -HI and lo == 0) then return -MAX_SCORE, true end
  return hi * B32 + lo, false
end

-- Whether entry a comes before b where combine() takes the first of equals: regions in
-- Python's sorted order.
local function before(a, b) return bytes_less(a.region, b.region) end

-- A user's global entry (signed, tie, meta) from its regional ones (at least one), as
-- combine() makes it, then whether it is a sum past the range, held at the range's end.
local function combined(op, entries)
  local pick = entries[1]
  if #entries == 1 then return pick.signed, pick.tie, pick.meta, false end
  if op == 'best' then
    for i = 2, #entries do
      local e = entries[i]
      if e.signed > pick.signed or (e.signed == pick.signed and (bytes_less(pick.tie, e.tie)
          or (e.tie == pick.tie and before(e, pick)))) then pick = e end
    end
    return pick.signed, pick.tie, pick.meta, false
  end
  -- The latest: the smallest time part (e.time: the tie key's last 12 hex digits; on set, the
  -- latest write's, merge.lua combined_record()).
  for i = 2, #entries do
    local e = entries[i]
    if e.time < pick.time or (e.time == pick.time and before(e, pick)) then pick = e end
  end
  if op == 'set' then return pick.signed, pick.tie, pick.meta, false end
  local total, past = exact_sum(entries)
  return total, string.sub(pick.tie, -12), pick.meta, past
end

-- BENCH_BATCH scores per request: POST /v1/boards/<BENCH_BOARD>/scores/batch.
package.path = debug.getinfo(1, "S").source:match("@(.*/)") .. "?.lua;" .. package.path
require("common")

local board = os.getenv("BENCH_BOARD") or "bench-batch"
local key = os.getenv("BENCH_KEY") or "dev-server-key"
local size = tonumber(os.getenv("BENCH_BATCH") or "500")
local path = "/v1/boards/" .. board .. "/scores/batch"
local headers = {["Content-Type"] = "application/json", ["Authorization"] = "Bearer " .. key}

function request()
  local events = {}
  for i = 1, size do events[i] = event() end
  return wrk.format("POST", path, headers, '{"events":[' .. table.concat(events, ",") .. ']}')
end

-- One score per request: POST /v1/boards/<BENCH_BOARD>/scores.
package.path = debug.getinfo(1, "S").source:match("@(.*/)") .. "?.lua;" .. package.path
require("common")

local board = os.getenv("BENCH_BOARD") or "bench-single"
local key = os.getenv("BENCH_KEY") or "dev-server-key"
local path = "/v1/boards/" .. board .. "/scores"
local headers = {["Content-Type"] = "application/json", ["Authorization"] = "Bearer " .. key}

function request()
  return wrk.format("POST", path, headers, event())
end

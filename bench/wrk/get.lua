-- GET requests over a list of paths (BENCH_PATHS, separated by spaces), round robin.
package.path = debug.getinfo(1, "S").source:match("@(.*/)") .. "?.lua;" .. package.path
require("common")

local paths = {}
for p in string.gmatch(os.getenv("BENCH_PATHS") or "/healthz", "%S+") do
  paths[#paths + 1] = p
end
local i = 0

function request()
  i = i + 1
  return wrk.format("GET", paths[(i % #paths) + 1])
end

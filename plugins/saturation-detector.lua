-- The EPP's saturation detector as an admission plugin (llm-d-router's
-- legacy admission with its utilization-detector): a sheddable request
-- (priority < 0) is rejected with 429 when the candidates' saturation level
-- is 1 or more — the mean of max(waiting / queueDepthThreshold, kv /
-- kvCacheUtilThreshold), an endpoint with stale (scraped more than
-- metricsStalenessThreshold ago), missing or NaN metrics scoring 1, and 1
-- with no candidates (lupin.utilization).
--
-- Priority: the EPP reads `x-llm-d-inference-objective` (llm-d's name; GIE's
-- `x-gateway-inference-objective` as its alias), looks up the
-- InferenceObjective it names and takes its priority, 0 when the header is
-- absent or names no objective; requests with priority ≥ 0 are never shed.
-- lupin has no InferenceObjective store, so the header's value is the
-- priority when it is an integer ("-1"), and anything else means 0.
local HEADER, OLD_HEADER = "x-llm-d-inference-objective", "x-gateway-inference-objective"
local utilization = require "lupin.utilization"

local function priority(ctx)
  local h = ctx.request.headers
  local v = h[HEADER] or h[OLD_HEADER]
  return v and tonumber(v:match("^%s*([-+]?%d+)%s*$")) or 0
end

---@type lupin.Plugin
return {
  type = "saturation-detector",
  schema = utilization.schema(),
  new = utilization.new,

  seconds = utilization.seconds,

  admit = function(self, ctx, endpoints)
    if priority(ctx) >= 0 or utilization.level(self, endpoints) < 1 then
      return
    end
    return false, 429, "system saturated, sheddable request dropped"
  end,

  -- As flow control's detector (docs/flow-control.md), utilization-detector's
  -- level with these thresholds: requests sent since a scrape count as waiting.
  saturated = function(self, endpoints, load)
    local level = utilization.level(self, endpoints, load.since_scrape)
    return level >= 1, level
  end,
}

-- The EPP's saturation detector as an admission plugin: a sheddable request
-- (priority < 0) is rejected with 429 when no candidate endpoint has fresh
-- metrics with waiting queue ≤ queueDepthThreshold and KV-cache usage ≤
-- kvCacheUtilThreshold (also when there are no candidates).  Metrics are
-- fresh when scraped at most metricsStalenessThreshold ago; never-scraped
-- endpoints are stale.
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
  schema = utilization.schema("saturated"),
  new = utilization.new,

  seconds = utilization.seconds,

  admit = function(self, ctx, endpoints)
    if priority(ctx) >= 0 or utilization.room(self, endpoints) then
      return
    end
    return false, 429, "system saturated, sheddable request dropped"
  end,

  -- As flow control's detector (docs/flow-control.md), utilization-detector's
  -- test with these thresholds: requests sent since a scrape count as waiting.
  saturated = function(self, endpoints, load)
    return not utilization.room(self, endpoints, load.since_scrape)
  end,
}

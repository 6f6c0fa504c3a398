-- The EPP's utilization-detector: the pool is saturated when no endpoint has
-- fresh metrics with a waiting queue ≤ queueDepthThreshold and KV-cache use
-- ≤ kvCacheUtilThreshold (saturation-detector's test, for every priority).
-- Metrics are fresh when scraped at most metricsStalenessThreshold ago.
-- Requests sent to an endpoint since its last scrape count as waiting
-- there: without them, every queued request would leave at once between two
-- scrapes.  The default saturation detector of flow control
-- (docs/flow-control.md).
local utilization = require "lupin.utilization"

---@type lupin.Plugin
return {
  type = "utilization-detector",
  schema = utilization.schema("full"),
  new = utilization.new,

  saturated = function(self, endpoints, load)
    return not utilization.room(self, endpoints, load.since_scrape)
  end,
}

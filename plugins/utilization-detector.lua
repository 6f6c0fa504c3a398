-- llm-d-router's utilization-detector: the pool's saturation level is the
-- mean over the candidates of max(waiting / queueDepthThreshold,
-- kv_cache_usage / kvCacheUtilThreshold), an endpoint with stale, missing
-- or NaN metrics scoring 1, and 1 with no candidates (lupin.utilization).
-- Flow control holds the queue while the level is 1 or more.  Requests
-- flow control sent to an endpoint since its last scrape count as waiting
-- there: without them, every queued request would leave at once between two
-- scrapes.  The default saturation detector of flow control
-- (docs/flow-control.md).  As a filter it keeps the fresh endpoints under
-- both thresholds × (1 + headroom), or all of them when none is.
local utilization = require "lupin.utilization"

local schema = utilization.schema()
schema.headroom = { type = "number", default = 0, min = 0,
  description = "burst the filter allows over the thresholds (0.2: 20%); the level ignores it" }

---@type lupin.Plugin
return {
  type = "utilization-detector",
  schema = schema,

  new = function(params, env)
    local self = utilization.new(params, env)
    self.queue_limit = params.queueDepthThreshold * (1 + params.headroom)
    self.kv_limit = params.kvCacheUtilThreshold * (1 + params.headroom)
    return self
  end,

  saturated = function(self, endpoints, load)
    local level = utilization.level(self, endpoints, load.since_scrape)
    return level >= 1, level
  end,

  filter = function(self, _, endpoints)
    local out, now = {}, self.now()
    for _, ep in ipairs(endpoints) do
      if ep.scraped_at > 0 and now - ep.scraped_at <= self.stale
        and ep.waiting_queue_size < self.queue_limit and ep.kv_cache_usage < self.kv_limit then
        out[#out + 1] = ep
      end
    end
    return #out > 0 and out or endpoints
  end,
}

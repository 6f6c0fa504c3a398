-- The EPP's utilization test, shared by saturation-detector (admission)
-- and utilization-detector (flow control): an endpoint has room when its
-- metrics are fresh (scraped at most metricsStalenessThreshold ago), its
-- waiting queue is at most queueDepthThreshold and its KV-cache use at most
-- kvCacheUtilThreshold.
local config = require "lupin.config"

local M = {}

--- The thresholds' schema fields; what a full endpoint means is the caller's.
---@param full string "saturated", "full": the word the descriptions use
function M.schema(full)
  return {
    queueDepthThreshold = { type = "integer", default = 5, min = 0,
      description = "an endpoint with a longer waiting queue is " .. full },
    kvCacheUtilThreshold = { type = "number", default = 0.8, min = 0, max = 1,
      description = "an endpoint with a fuller KV cache is " .. full },
    metricsStalenessThreshold = { type = "any", default = 200,
      description = "metrics older than this count as none: milliseconds, or a duration"
        .. ' "200ms"' },
  }
end

--- metricsStalenessThreshold in seconds: milliseconds, or a Go duration
--- ("200ms", "1.5s", "1m30s"); nil when it is neither.
function M.seconds(v)
  if type(v) == "number" then
    return v == v and v >= 0 and v / 1000 or nil
  end
  return config.duration(v)
end

--- The detector's state, or an error naming the bad threshold.
function M.new(params, env)
  local stale = M.seconds(params.metricsStalenessThreshold)
  if not stale then
    error(("metricsStalenessThreshold must be a number of milliseconds ≥ 0 or a duration"
      .. " such as \"200ms\", got %s"):format(tostring(params.metricsStalenessThreshold)), 0)
  end
  return { params = params, stale = stale, now = env.now }
end

--- Whether some endpoint has room; waiting(ep): requests to add to its
--- scraped queue (those sent since its scrape, for flow control), or nil.
function M.room(self, endpoints, waiting)
  local p, now = self.params, self.now()
  for _, ep in ipairs(endpoints) do
    if ep.scraped_at > 0 and now - ep.scraped_at <= self.stale
      and ep.waiting_queue_size + (waiting and waiting(ep) or 0) <= p.queueDepthThreshold
      and ep.kv_cache_usage <= p.kvCacheUtilThreshold then
      return true
    end
  end
  return false
end

return M

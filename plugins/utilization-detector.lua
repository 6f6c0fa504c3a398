-- The EPP's utilization-detector: the pool is saturated when no endpoint has
-- fresh metrics with a waiting queue ≤ queueDepthThreshold and KV-cache use
-- ≤ kvCacheUtilThreshold (saturation-detector's test, for every priority).
-- Metrics are fresh when scraped at most metricsStalenessThreshold ago.
-- Requests sent to an endpoint since its last scrape count as waiting
-- there: without them, every queued request would leave at once between two
-- scrapes.  The default saturation detector of flow control
-- (docs/flow-control.md).
local UNITS = { ns = 1e-9, us = 1e-6, ms = 1e-3, s = 1, m = 60, h = 3600 }

-- milliseconds, or a Go duration ("200ms", "1.5s")
local function seconds(v)
  if type(v) == "number" then
    return v == v and v >= 0 and v / 1000 or nil
  elseif v == "0" then
    return 0
  elseif type(v) ~= "string" or v == "" then
    return nil
  end
  local total, rest = 0, v
  while rest ~= "" do
    local num, unit, tail = rest:match("^(%d*%.?%d+)(%a+)(.*)$")
    if not num or not UNITS[unit] then
      return nil
    end
    total, rest = total + tonumber(num) * UNITS[unit], tail
  end
  return total
end

---@type lupin.Plugin
return {
  type = "utilization-detector",
  schema = {
    queueDepthThreshold = { type = "integer", default = 5, min = 0,
      description = "an endpoint with a longer waiting queue is full" },
    kvCacheUtilThreshold = { type = "number", default = 0.8, min = 0, max = 1,
      description = "an endpoint with a fuller KV cache is full" },
    metricsStalenessThreshold = { type = "any", default = 200,
      description = "metrics older than this count as full: milliseconds, or a duration \"200ms\"" },
  },

  new = function(params, env)
    local stale = seconds(params.metricsStalenessThreshold)
    if not stale then
      error(("metricsStalenessThreshold must be a number of milliseconds ≥ 0 or a duration"
        .. " such as \"200ms\", got %s"):format(tostring(params.metricsStalenessThreshold)), 0)
    end
    return { params = params, stale = stale, now = env.now }
  end,

  saturated = function(self, endpoints, load)
    local p, now = self.params, self.now()
    for _, ep in ipairs(endpoints) do
      if ep.scraped_at > 0 and now - ep.scraped_at <= self.stale
        and ep.waiting_queue_size + load.since_scrape(ep) <= p.queueDepthThreshold
        and ep.kv_cache_usage <= p.kvCacheUtilThreshold then
        return false
      end
    end
    return true
  end,
}

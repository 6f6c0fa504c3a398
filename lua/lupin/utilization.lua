-- The EPP's utilization level (llm-d-router's utilization-detector),
-- shared by saturation-detector (admission), utilization-detector (flow
-- control) and their specs.  An endpoint's score is its most constrained
-- resource, max(waiting / queueDepthThreshold, kv / kvCacheUtilThreshold);
-- one whose metrics are stale (scraped more than metricsStalenessThreshold
-- ago), never scraped, or not reported (NaN) scores 1, fully saturated.
-- The pool's level is the mean score over the candidates, 1 with none: 1
-- or more is saturated, above 1 is how far over.
local config = require "lupin.config"

local M = {}

--- The thresholds' schema fields.
function M.schema()
  return {
    queueDepthThreshold = { type = "integer", default = 5, min = 1,
      description = "waiting requests at which an endpoint scores 1 (fully saturated)" },
    kvCacheUtilThreshold = { type = "number", default = 0.8, above = 0, max = 1,
      description = "KV-cache use (0 to 1) at which an endpoint scores 1 (fully saturated)" },
    metricsStalenessThreshold = { type = "any", default = 200,
      description = "metrics older than this count as none (the endpoint scores 1):"
        .. ' milliseconds, or a duration "200ms"' },
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
  if not stale or stale <= 0 then
    error(("metricsStalenessThreshold must be a number of milliseconds > 0 or a duration"
      .. " such as \"200ms\", got %s"):format(tostring(params.metricsStalenessThreshold)), 0)
  end
  return { queue = params.queueDepthThreshold, kv = params.kvCacheUtilThreshold,
    stale = stale, now = env.now, params = params }
end

--- The pool's level over endpoints; waiting(ep): requests to add to an
--- endpoint's scraped queue (those sent since its scrape, for flow
--- control), or nil.  One pass, no allocation: it runs per decision.
function M.level(self, endpoints, waiting)
  local n = #endpoints
  if n == 0 then
    return 1
  end
  local total, queue, kv, now, stale = 0, self.queue, self.kv, self.now(), self.stale
  for i = 1, n do
    local ep = endpoints[i]
    local w, u, s = ep.waiting_queue_size, ep.kv_cache_usage, 1
    if ep.scraped_at > 0 and now - ep.scraped_at <= stale and w == w and u == u then
      if waiting then
        w = w + waiting(ep)
      end
      s = math.max(w / queue, u / kv)
    end
    total = total + s
  end
  return total / n
end

--- Whether some endpoint is fresh with a queue (plus waiting(ep)) and a KV
--- use at most the thresholds: GIE v1's test, which the detectors used
--- before the level; kept for plugins written against it.
function M.room(self, endpoints, waiting)
  local now = self.now()
  for _, ep in ipairs(endpoints) do
    if ep.scraped_at > 0 and now - ep.scraped_at <= self.stale
      and ep.waiting_queue_size + (waiting and waiting(ep) or 0) <= self.queue
      and ep.kv_cache_usage <= self.kv then
      return true
    end
  end
  return false
end

return M

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
local UNITS = { ns = 1e-9, us = 1e-6, ["µs"] = 1e-6, ms = 1e-3, s = 1, m = 60, h = 3600 }

-- metricsStalenessThreshold in seconds: a number of milliseconds, or a Go
-- duration string ("200ms", "1.5s", "1m30s").
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
    if not num then
      num, unit, tail = rest:match("^(%d*%.?%d+)(µs)(.*)$")
    end
    if not num or not UNITS[unit] then
      return nil
    end
    total, rest = total + tonumber(num) * UNITS[unit], tail
  end
  return total
end

local function priority(ctx)
  local h = ctx.request.headers
  local v = h[HEADER] or h[OLD_HEADER]
  return v and tonumber(v:match("^%s*([-+]?%d+)%s*$")) or 0
end

---@type lupin.Plugin
return {
  type = "saturation-detector",
  schema = {
    queueDepthThreshold = { type = "integer", default = 5, min = 0,
      description = "an endpoint with a longer waiting queue is saturated" },
    kvCacheUtilThreshold = { type = "number", default = 0.8, min = 0, max = 1,
      description = "an endpoint with a fuller KV cache is saturated" },
    metricsStalenessThreshold = { type = "any", default = 200,
      description = "metrics older than this are ignored: milliseconds, or a duration \"200ms\"" },
  },

  new = function(params, env)
    local stale = seconds(params.metricsStalenessThreshold)
    if not stale then
      error(("metricsStalenessThreshold must be a number of milliseconds ≥ 0 or a duration"
        .. " such as \"200ms\", got %s"):format(tostring(params.metricsStalenessThreshold)), 0)
    end
    return { params = params, stale = stale, now = env.now }
  end,

  seconds = seconds,

  admit = function(self, ctx, endpoints)
    if priority(ctx) >= 0 then
      return
    end
    local p, now = self.params, self.now()
    for _, ep in ipairs(endpoints) do
      if ep.scraped_at > 0 and now - ep.scraped_at <= self.stale
        and ep.waiting_queue_size <= p.queueDepthThreshold
        and ep.kv_cache_usage <= p.kvCacheUtilThreshold then
        return
      end
    end
    return false, 429, "system saturated, sheddable request dropped"
  end,

  -- As flow control's detector (docs/flow-control.md), utilization-detector's
  -- test with these thresholds: requests sent since a scrape count as waiting.
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

-- llm-d-router's probabilistic-admitter: sheds sheddable requests
-- (priority < 0) at random, more often as the pool fills up, instead of
-- saturation-detector's all-or-nothing gate.  The pool's saturation is the
-- mean over the candidates of max(waiting / queueDepthThreshold,
-- kv_cache_usage / kvCacheUtilThreshold); a request is refused (429) with
-- probability min(saturation ^ power * k, 1).
--
-- An endpoint never scraped counts 1 (upstream: no metrics, fully
-- saturated), and so does one with a metric it never reported (NaN), as
-- saturation-detector counts it saturated.  No candidates: admitted.  The
-- priority is the one flow control gives the request from its objective
-- header (ctx.request.priority), 0 when none is given.

-- The pool's saturation over these endpoints (at least one).
local function saturation(self, endpoints)
  local total, queue, kv = 0, self.queue, self.kv
  for _, ep in ipairs(endpoints) do
    local w, u = ep.waiting_queue_size, ep.kv_cache_usage
    local s = 1
    if ep.scraped_at > 0 and w == w and u == u then -- scraped, and no NaN
      s = math.max(w / queue, u / kv)
    end
    total = total + s
  end
  return total / #endpoints
end

---@type lupin.Plugin
return {
  type = "probabilistic-admitter",
  schema = {
    queueDepthThreshold = { type = "integer", default = 5, min = 1,
      description = "waiting requests at which an endpoint counts as fully saturated" },
    kvCacheUtilThreshold = { type = "number", default = 0.8, above = 0,
      description = "KV-cache use (0 to 1) at which an endpoint counts as fully saturated" },
    power = { type = "number", default = 5, above = 0,
      description = "steepness of the shedding curve: higher waits longer, then climbs faster" },
    k = { type = "number", default = 300, above = 0,
      description = "scale of the shedding curve: everything sheddable is shed from saturation"
        .. " (1/k)^(1/power) on" },
  },

  new = function(p)
    return { queue = p.queueDepthThreshold, kv = p.kvCacheUtilThreshold, power = p.power, k = p.k,
      rand = math.random }
  end,

  admit = function(self, ctx, endpoints)
    local priority = ctx.request.priority or 0
    if priority >= 0 or #endpoints == 0 then
      return
    end
    local sat = saturation(self, endpoints)
    local prob = math.min(sat ^ self.power * self.k, 1)
    if self.rand() < prob then
      return false, 429, ("sheddable request shed (priority %d < 0): the pool's saturation is %.3f,"
        .. " so sheddable requests are shed with probability %.2f; retry later or raise its"
        .. " priority"):format(priority, sat, prob)
    end
  end,
}

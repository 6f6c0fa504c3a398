-- The EPP's concurrency-detector: the pool is saturated when every endpoint
-- has maxConcurrency requests in flight or more — requests this gateway
-- sent there and that have not ended (ep.in_flight: the core's count over
-- every worker of the process, exact, with no wait for a scrape).  A saturation detector of flow control
-- (docs/flow-control.md): saturated(endpoints, load).
---@type lupin.Plugin
return {
  type = "concurrency-detector",
  schema = {
    maxConcurrency = { type = "integer", default = 100, min = 1,
      description = "requests in flight an endpoint takes before it counts as full" },
    concurrencyMode = { type = "string", default = "requests", enum = { "requests" },
      description = "what is counted: requests (tokens are not counted yet)" },
    headroom = { type = "number", default = 0, min = 0, max = 1,
      description = "a fraction of maxConcurrency kept free: full at maxConcurrency × (1 - headroom)" },
  },

  new = function(params)
    return { limit = math.max(1, math.floor(params.maxConcurrency * (1 - params.headroom))) }
  end,

  saturated = function(self, endpoints, load)
    local limit, used = self.limit, 0
    for _, ep in ipairs(endpoints) do
      local n = load.inflight(ep)
      if n < limit then
        return false, n / limit
      end
      used = used + 1
    end
    return true, 1
  end,
}

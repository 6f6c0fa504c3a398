-- llm-d-router's concurrency-detector: the pool's saturation level from
-- what is in flight, counted by the core for every worker of the process
-- with no wait for a scrape.  concurrencyMode "requests": requests in flight
-- over candidates × maxConcurrency (ep.in_flight); "tokens": tokens in
-- flight over candidates × maxTokenConcurrency (ep.in_flight_tokens, what
-- inflight-load-producer or token-load-scorer hold there: without one of
-- them it stays 0); "hybrid": the mean over the candidates of the larger of
-- the two ratios, so an endpoint full on either one counts full.  No
-- candidates: 1.  Flow control holds the queue while the level is 1 or
-- more.  As a filter it drops the endpoints at limit × (1 + headroom) or
-- over (both limits in hybrid mode), keeping none when all are.
-- A saturation detector of flow control (docs/flow-control.md).

local function over(self, ep)
  local mode = self.mode
  if mode ~= "tokens" and ep.in_flight >= self.req_limit then
    return true
  end
  return mode ~= "requests" and ep.in_flight_tokens >= self.tok_limit
end

---@type lupin.Plugin
return {
  type = "concurrency-detector",
  schema = {
    maxConcurrency = { type = "integer", default = 100, min = 1,
      description = "requests in flight at which an endpoint counts as full" },
    maxTokenConcurrency = { type = "integer", default = 1000000, min = 1,
      description = "tokens in flight at which an endpoint counts as full (tokens, hybrid)" },
    concurrencyMode = { type = "string", default = "requests",
      enum = { "requests", "tokens", "hybrid" },
      description = "what is counted: requests, tokens, or hybrid (each endpoint's larger ratio)" },
    headroom = { type = "number", default = 0, min = 0,
      description = "burst the filter allows over the limits (0.2: 20%); the level ignores it" },
    inFlightLoadProducerName = { type = "string", default = "",
      description = "accepted for llm-d-router's configs: lupin has one token count per"
        .. " endpoint, whichever plugin sets it" },
  },

  new = function(p)
    return { mode = p.concurrencyMode, max = p.maxConcurrency, max_tokens = p.maxTokenConcurrency,
      req_limit = math.floor(p.maxConcurrency * (1 + p.headroom)),
      tok_limit = math.floor(p.maxTokenConcurrency * (1 + p.headroom)) }
  end,

  saturated = function(self, endpoints, load)
    local n = #endpoints
    if n == 0 then
      return true, 1
    end
    local mode, max, max_tokens, sum = self.mode, self.max, self.max_tokens, 0
    for i = 1, n do
      local ep = endpoints[i]
      if mode == "requests" then
        sum = sum + load.inflight(ep)
      elseif mode == "tokens" then
        sum = sum + load.tokens(ep)
      else
        sum = sum + math.max(load.inflight(ep) / max, load.tokens(ep) / max_tokens)
      end
    end
    local level = mode == "requests" and sum / (n * max)
      or mode == "tokens" and sum / (n * max_tokens) or sum / n
    return level >= 1, level
  end,

  filter = function(self, _, endpoints)
    local out = {}
    for _, ep in ipairs(endpoints) do
      if not over(self, ep) then
        out[#out + 1] = ep
      end
    end
    return out
  end,
}

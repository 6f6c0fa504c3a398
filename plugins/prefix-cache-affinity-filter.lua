-- Keeps the endpoints whose prefix match (matched blocks / prompt blocks, as
-- the prefix scorer named prefixPluginName computed it) is at least
-- affinityThreshold; keeps them all when none passes, and, with probability
-- explorationProbability, keeps all anyway so other endpoints get to warm up.
-- The TTFT load gate keeps them all too when the best sticky endpoint's TTFT
-- is more than maxTTFTPenaltyMs over the best other's: estimated from its
-- tokens in flight at peakPrefillThroughput, or predicted
-- (ttftSource: latencyPredictor, predicted-latency-producer's).
local slo = require "lupin.slo"

local random = math.random
local DEFAULT_PREFIX = "prefix-cache-scorer"

-- Match fractions by endpoint id: the prefix scorer's, else (its name not
-- given and none of that name ran) predicted-latency-producer's, which keeps
-- an index of its own when the config has no prefix producer.
local function fractions(self, ctx)
  local st = ctx.shared[self.prefix]
  if st then
    if st.total == 0 then
      return nil
    end
    local f = {}
    for id, n in pairs(st.matches) do
      f[id] = n / st.total
    end
    return f
  end
  local pred = self.prefix == DEFAULT_PREFIX and slo.predictions(ctx)
  if pred then
    return pred.prefix
  end
  error(("no prefix matches from %q: configure that prefix-cache-scorer, or set"
    .. " prefixPluginName"):format(self.prefix))
end

-- An endpoint's TTFT for the load gate, or nil when its source has none.
local function ttft(self, ctx, ep)
  if self.source == "latencyPredictor" then
    local pred = slo.predictions(ctx)
    local e = pred and pred.endpoints[ep.id]
    return e and e.ttft
  end
  return ep.in_flight_tokens / self.peak * 1000
end

-- Whether sticky endpoints are so loaded that stickiness costs more TTFT
-- than maxTTFTPenaltyMs: the best sticky against the best of the others.
local function too_slow(self, ctx, kept, endpoints, sticky)
  if self.penalty <= 0 or #kept == #endpoints then
    return false
  end
  local best_in, best_out = math.huge, math.huge
  for _, ep in ipairs(endpoints) do
    local t = ttft(self, ctx, ep)
    if t then
      if sticky[ep] then
        best_in = math.min(best_in, t)
      else
        best_out = math.min(best_out, t)
      end
    end
  end
  return best_in < math.huge and best_out < math.huge and best_in - best_out > self.penalty
end

---@type lupin.Plugin
return {
  type = "prefix-cache-affinity-filter",
  schema = {
    affinityThreshold = { type = "number", default = 0.8, min = 0, max = 1,
      description = "the prefix match an endpoint needs to be kept" },
    explorationProbability = { type = "number", default = 0, min = 0, max = 1,
      description = "chance of skipping the filter for a request" },
    prefixPluginName = { type = "string", default = DEFAULT_PREFIX,
      description = "the prefix-cache-scorer instance whose matches are used" },
    maxTTFTPenaltyMs = { type = "number", default = 18000, min = 0,
      description = "TTFT the sticky endpoints may cost over the others before all are kept"
        .. " (0: always stick)" },
    ttftSource = { type = "string", default = "prefillThroughput",
      enum = { "prefillThroughput", "latencyPredictor" },
      description = "the TTFT of the load gate: tokens in flight over peakPrefillThroughput,"
        .. " or predicted-latency-producer's predictions" },
    peakPrefillThroughput = { type = "number", default = 15928, min = 0,
      description = "prefill tokens per second an endpoint does (the prefillThroughput source;"
        .. " > 0 when that source is used)" },
    inFlightLoadProducerName = { type = "string",
      description = "an inflight-load-producer instance: its load is ep.in_flight_tokens,"
        .. " which the gate reads either way" },
  },

  new = function(p)
    -- 0 is fine while nothing divides by it, as upstream's factory allows
    if p.peakPrefillThroughput == 0 and p.maxTTFTPenaltyMs > 0
      and p.ttftSource == "prefillThroughput" then
      error("peakPrefillThroughput must be > 0 when ttftSource is prefillThroughput and"
        .. " maxTTFTPenaltyMs is above 0", 0)
    end
    return { threshold = p.affinityThreshold, explore = p.explorationProbability,
      prefix = p.prefixPluginName, penalty = p.maxTTFTPenaltyMs, source = p.ttftSource,
      peak = p.peakPrefillThroughput }
  end,

  filter = function(self, ctx, endpoints)
    local f = fractions(self, ctx)
    if not f or random() < self.explore then
      return endpoints
    end
    local kept, sticky = {}, {}
    for _, ep in ipairs(endpoints) do
      if (f[ep.id] or 0) >= self.threshold then
        kept[#kept + 1] = ep
        sticky[ep] = true
      end
    end
    if #kept == 0 or too_slow(self, ctx, kept, endpoints, sticky) then
      return endpoints
    end
    return kept
  end,
}

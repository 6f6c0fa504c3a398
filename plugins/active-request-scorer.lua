-- llm-d's active-request scorer: prefers endpoints with fewer requests in
-- flight through this gateway.  It reads ep.in_flight: the core counts a
-- request on each endpoint its profiles chose, from scheduling to its end on
-- every path (success, upstream error, cancel, timeout), in one counter per
-- endpoint that every worker of the process shares, so there is no timeout
-- sweep and no count of its own to carry over a reload.  Upstream reads the
-- counts of an inflight-load-producer (inFlightLoadProducerName); lupin's
-- producer leaves requests to the core, so the name is checked (it must name
-- one, lupin.datalayer) and the core's count read.
--
-- Score of an endpoint with c requests in flight, max over the candidates:
-- 1.0 when c ≤ idleThreshold, else maxBusyScore × (max − c) / max.
---@type lupin.Plugin
return {
  type = "active-request-scorer",
  schema = {
    idleThreshold = { type = "integer", default = 0, min = 0, fallback = 0,
      description = "endpoints with at most this many requests in flight score 1" },
    maxBusyScore = { type = "number", default = 1.0, min = 0, max = 1,
      description = "the score of the least busy endpoint above idleThreshold" },
    requestTimeout = { type = "any",
      description = "accepted for llm-d configs and ignored: counts are released at the end" },
    inFlightLoadProducerName = { type = "string",
      description = "an inflight-load-producer instance; the counts are the core's either way" },
  },

  new = function(params)
    return { params = params }
  end,

  score = function(self, _, endpoints)
    local idle, busy = self.params.idleThreshold, self.params.maxBusyScore
    local n, c, max = #endpoints, {}, 0
    for i = 1, n do
      c[i] = endpoints[i].in_flight
      max = math.max(max, c[i])
    end
    local scores = {}
    for i = 1, n do
      scores[i] = c[i] <= idle and 1 or busy * (max - c[i]) / max
    end
    return scores
  end,
}

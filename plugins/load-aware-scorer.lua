-- llm-d's load-aware scorer: an empty waiting queue scores 0.5; a queue of q
-- scores 0.5 × (1 − min(q, threshold) / threshold), reaching 0 at the
-- threshold.  A missing metric reads 0.
---@type lupin.Plugin
return {
  type = "load-aware-scorer",
  schema = {
    threshold = { type = "integer", default = 128, min = 1, fallback = 128,
      description = "waiting queue size at which an endpoint scores 0" },
  },

  score = function(self, _, endpoints)
    local t = self.params.threshold
    local scores = {}
    for i = 1, #endpoints do
      local q = endpoints[i].waiting_queue_size
      q = q == q and q or 0 -- NaN: missing
      scores[i] = q <= 0 and 0.5 or 0.5 * (1 - math.min(q, t) / t)
    end
    return scores
  end,
}

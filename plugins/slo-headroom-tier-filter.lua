-- llm-d-router's slo-headroom-tier-filter: splits the candidates by
-- predicted-latency-producer's predictions (lupin.slo) into a positive tier
-- (TTFT and TPOT headroom both ≥ 0: the objectives are met) and a negative
-- one (an objective missed, or no prediction: nothing says it is met), and
-- keeps one tier: the positive, or with probability epsilonExploreNeg the
-- negative, so endpoints recovering from overload still get traffic and
-- fresh predictions.  One tier alone is kept; with no prediction for any
-- candidate (or no producer) all are kept.
local slo = require "lupin.slo"
local random = math.random

---@type lupin.Plugin
return {
  type = "slo-headroom-tier-filter",
  schema = {
    epsilonExploreNeg = { type = "number", default = 0.01, min = 0, max = 1,
      description = "chance of keeping the negative tier when both tiers have endpoints" },
  },

  new = function(p)
    return { epsilon = p.epsilonExploreNeg }
  end,

  filter = function(self, ctx, endpoints)
    local pl = #endpoints > 1 and slo.predictions(ctx)
    local preds = pl and pl.endpoints
    if not preds then
      return endpoints
    end
    local positive, negative, unknown = {}, {}, {}
    for _, ep in ipairs(endpoints) do
      local p = preds[ep.id]
      local tier = not p and unknown or (p.ttft_headroom >= 0 and p.tpot_headroom >= 0) and positive
        or negative
      tier[#tier + 1] = ep
    end
    if #positive == 0 and #negative == 0 then
      return endpoints
    end
    for _, ep in ipairs(unknown) do
      negative[#negative + 1] = ep
    end
    if #positive == 0 then
      return negative
    elseif #negative == 0 then
      return positive
    end
    return random() < self.epsilon and negative or positive
  end,
}

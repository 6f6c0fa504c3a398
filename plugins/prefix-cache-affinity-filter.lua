-- Keeps the endpoints whose prefix match (matched blocks / prompt blocks, as
-- the prefix scorer named prefixPluginName computed it) is at least
-- affinityThreshold; keeps them all when none passes, and, with probability
-- explorationProbability, keeps all anyway so other endpoints get to warm up.
local random = math.random

---@type lupin.Plugin
return {
  type = "prefix-cache-affinity-filter",
  schema = {
    affinityThreshold = { type = "number", default = 0.8, min = 0, max = 1,
      description = "the prefix match an endpoint needs to be kept" },
    explorationProbability = { type = "number", default = 0, min = 0, max = 1,
      description = "chance of skipping the filter for a request" },
    prefixPluginName = { type = "string", default = "prefix-cache-scorer",
      description = "the prefix-cache-scorer instance whose matches are used" },
  },

  new = function(p)
    return { threshold = p.affinityThreshold, explore = p.explorationProbability,
      prefix = p.prefixPluginName }
  end,

  filter = function(self, ctx, endpoints)
    local st = ctx.shared[self.prefix]
    if not st then
      error(("no prefix matches from %q: configure that prefix-cache-scorer, or set"
        .. " prefixPluginName"):format(self.prefix))
    end
    if st.total == 0 or random() < self.explore then
      return endpoints
    end
    local kept = {}
    for _, ep in ipairs(endpoints) do
      if (st.matches[ep.id] or 0) / st.total >= self.threshold then
        kept[#kept + 1] = ep
      end
    end
    return #kept > 0 and kept or endpoints
  end,
}

-- Prefers endpoints with free KV cache: 1 − KV-cache usage (usage 0..1,
-- clamped).  A missing metric reads 0 (score 1), as in the EPP.
local new_table = require "table.new"

---@type lupin.Plugin
return {
  type = "kv-cache-utilization-scorer",
  schema = {},

  -- the engine reads the scores as they are returned and keeps none: one
  -- list per instance serves every request
  new = function()
    return { scores = new_table(16, 0) }
  end,

  score = function(self, _, endpoints)
    local n = #endpoints
    local scores = self.scores
    for i = #scores, n + 1, -1 do -- fewer candidates than last time
      scores[i] = nil
    end
    for i = 1, n do
      local u = endpoints[i].kv_cache_usage
      u = u == u and u or 0 -- NaN: missing
      scores[i] = math.max(0, math.min(1, 1 - u))
    end
    return scores
  end,
}

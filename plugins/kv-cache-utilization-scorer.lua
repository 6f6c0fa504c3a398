-- Prefers endpoints with free KV cache: 1 − KV-cache usage (usage 0..1,
-- clamped).  A missing metric reads 0 (score 1), as in the EPP.
local new_table = require "table.new"

---@type lupin.Plugin
return {
  type = "kv-cache-utilization-scorer",
  schema = {},

  score = function(_, _, endpoints)
    local n = #endpoints
    local scores = new_table(n, 0)
    for i = 1, n do
      local u = endpoints[i].kv_cache_usage
      u = u == u and u or 0 -- NaN: missing
      scores[i] = math.max(0, math.min(1, 1 - u))
    end
    return scores
  end,
}

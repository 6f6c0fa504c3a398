-- Picks maxNumOfEndpoints endpoints uniformly at random, ignoring scores
-- (a partial Fisher-Yates shuffle).
local picker = require "lupin.picker"

local random = math.random

---@type lupin.Plugin
return {
  type = "random-picker",
  schema = picker.schema,

  new = function(params)
    return { k = picker.count(params) }
  end,

  pick = function(self, _, scored)
    local eps = scored.endpoints
    local n = #eps
    local order = {}
    for i = 1, n do
      order[i] = i
    end
    local out = {}
    for i = 1, math.min(self.k, n) do
      local j = random(i, n)
      order[i], order[j] = order[j], order[i]
      out[i] = eps[order[i]]
    end
    return out
  end,
}

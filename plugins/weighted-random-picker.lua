-- Picks maxNumOfEndpoints endpoints at random with probability proportional
-- to their scores, without replacement: A-Res (Efraimidis–Spirakis), each
-- endpoint gets the key U^(1/score) with U uniform in (0, 1), and the largest
-- keys win, best first.  Endpoints scoring ≤ 0 are never picked, unless all
-- do: then the pick is uniform over all of them.
local picker = require "lupin.picker"

local random = math.random

---@type lupin.Plugin
return {
  type = "weighted-random-picker",
  schema = picker.schema,

  new = function(params)
    return { k = picker.count(params) }
  end,

  pick = function(self, _, scored)
    local eps, scores = scored.endpoints, scored.scores
    local order, key = {}, {}
    for i = 1, #eps do
      local s = scores[i]
      if s > 0 then
        order[#order + 1] = i
        key[i] = (1 - random()) ^ (1 / s) -- 1 − [0, 1) is (0, 1]
      end
    end
    if #order == 0 then -- nothing scored above 0: uniform
      for i = 1, #eps do
        order[i] = i
        key[i] = random()
      end
    end
    table.sort(order, function(a, b) return key[a] > key[b] end)
    local out = {}
    for i = 1, math.min(self.k, #order) do
      out[i] = eps[order[i]]
    end
    return out
  end,
}

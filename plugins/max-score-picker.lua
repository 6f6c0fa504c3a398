-- Picks the endpoints with the highest total score, best first; ties are
-- broken at random so equal endpoints share the load.
local picker = require "lupin.picker"

local random = math.random

local function best(endpoints, scores)
  local top, pick, ties = -math.huge, nil, 0
  for i = 1, #endpoints do
    local s = scores[i]
    if s > top then
      top, pick, ties = s, i, 1
    elseif s == top then
      ties = ties + 1
      if random(ties) == 1 then
        pick = i
      end
    end
  end
  return { endpoints[pick] }
end

local function ranked(endpoints, scores, k)
  local order, key = {}, {}
  for i = 1, #endpoints do
    order[i] = i
    key[i] = random()
  end
  table.sort(order, function(a, b)
    if scores[a] ~= scores[b] then
      return scores[a] > scores[b]
    end
    return key[a] < key[b]
  end)
  local out = {}
  for i = 1, math.min(k, #order) do
    out[i] = endpoints[order[i]]
  end
  return out
end

return {
  type = "max-score-picker",
  schema = picker.schema,

  new = function(params)
    return { k = picker.count(params) }
  end,

  pick = function(self, _, scored)
    if self.k == 1 then
      return best(scored.endpoints, scored.scores)
    end
    return ranked(scored.endpoints, scored.scores, self.k)
  end,
}

-- Picks the endpoints with the highest total score, best first; ties are
-- broken at random so equal endpoints share the load.
local picker = require "lupin.picker"

local new_table = require "table.new"

local random = math.random
local SELECT_MAX = 8 -- up to this many picks, selection beats a sort

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

-- True when endpoint a ranks before b: higher score, then the lower key.
local function before(scores, key, a, b)
  local sa, sb = scores[a], scores[b]
  return sa > sb or (sa == sb and key[a] < key[b])
end

-- The k best in order, ties broken by a random key per endpoint.  Few picks
-- are selected pass by pass (no comparator closure per call, no calls back
-- from table.sort); many sort.
local function ranked(endpoints, scores, k)
  local n, key = #endpoints, new_table(#endpoints, 0)
  for i = 1, n do
    key[i] = random()
  end
  k = math.min(k, n)
  local order = new_table(n, 0)
  if k <= SELECT_MAX then
    local taken = new_table(n, 0)
    for j = 1, k do
      local pick
      for i = 1, n do
        if not taken[i] and (not pick or before(scores, key, i, pick)) then
          pick = i
        end
      end
      taken[pick], order[j] = true, pick
    end
  else
    for i = 1, n do
      order[i] = i
    end
    table.sort(order, function(a, b)
      return before(scores, key, a, b)
    end)
  end
  local out = new_table(k, 0)
  for i = 1, k do
    out[i] = endpoints[order[i]]
  end
  return out
end

---@type lupin.Plugin
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

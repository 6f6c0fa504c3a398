-- Prefers endpoints with shorter waiting queues: (max − q) / (max − min) over
-- the candidates' waiting queue sizes, so the shortest queue scores 1 and the
-- longest 0; when all are equal every endpoint scores 1.  A metric that is
-- missing (never scraped) reads 0, as in the EPP.
local new_table = require "table.new"

---@type lupin.Plugin
return {
  type = "queue-scorer",
  schema = {},

  score = function(_, _, endpoints)
    local n, min, max = #endpoints, math.huge, -math.huge
    for i = 1, n do
      local v = endpoints[i].waiting_queue_size
      v = v == v and v or 0 -- NaN: missing
      min, max = math.min(min, v), math.max(max, v)
    end
    -- the queues are read again rather than kept in a table: one allocation less
    local scores = new_table(n, 0)
    for i = 1, n do
      local v = endpoints[i].waiting_queue_size
      v = v == v and v or 0
      scores[i] = max == min and 1 or (max - v) / (max - min)
    end
    return scores
  end,
}

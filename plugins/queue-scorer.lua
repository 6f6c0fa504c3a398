-- Prefers endpoints with shorter waiting queues: (max − q) / (max − min) over
-- the candidates' waiting queue sizes, so the shortest queue scores 1 and the
-- longest 0; when all are equal every endpoint scores 1.  A metric that is
-- missing (never scraped) reads 0, as in the EPP.
local new_table = require "table.new"

---@type lupin.Plugin
return {
  type = "queue-scorer",
  schema = {},

  -- the engine reads the scores as they are returned and keeps none: one
  -- list per instance serves every request
  new = function()
    return { scores = new_table(16, 0) }
  end,

  score = function(self, _, endpoints)
    local n, min, max = #endpoints, math.huge, -math.huge
    for i = 1, n do
      local v = endpoints[i].waiting_queue_size
      v = v == v and v or 0 -- NaN: missing
      min, max = math.min(min, v), math.max(max, v)
    end
    -- the queues are read again rather than kept in a table: one allocation less
    local scores = self.scores
    for i = #scores, n + 1, -1 do -- fewer candidates than last time
      scores[i] = nil
    end
    for i = 1, n do
      local v = endpoints[i].waiting_queue_size
      v = v == v and v or 0
      scores[i] = max == min and 1 or (max - v) / (max - min)
    end
    return scores
  end,
}

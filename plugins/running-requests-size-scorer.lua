-- Prefers endpoints running fewer requests: (max − r) / (max − min) over the
-- candidates' running request counts (the queue-scorer formula); when all are
-- equal every endpoint scores 1.  A missing metric reads 0, as in the EPP.
---@type lupin.Plugin
return {
  type = "running-requests-size-scorer",
  schema = {},

  score = function(_, _, endpoints)
    local n, r, min, max = #endpoints, {}, math.huge, -math.huge
    for i = 1, n do
      local v = endpoints[i].running_requests
      v = v == v and v or 0 -- NaN: missing
      r[i] = v
      min, max = math.min(min, v), math.max(max, v)
    end
    local scores = {}
    for i = 1, n do
      scores[i] = max == min and 1 or (max - r[i]) / (max - min)
    end
    return scores
  end,
}

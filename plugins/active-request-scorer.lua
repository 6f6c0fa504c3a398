-- llm-d's active-request scorer: prefers endpoints with fewer requests in
-- flight through this gateway.  pre_request counts one request against each
-- profile's chosen endpoint and remembers what it counted in the request's
-- private state; finish releases exactly that, on every path (success,
-- upstream error, cancel, timeout), so there is no timeout sweep.
--
-- Score of an endpoint with c requests in flight, max over the candidates:
-- 1.0 when c ≤ idleThreshold (an untracked endpoint has c = 0), else
-- maxBusyScore × (max − c) / max.
local function release(counts, name)
  local c = (counts[name] or 0) - 1
  counts[name] = c > 0 and c or nil
end

---@type lupin.Plugin
return {
  type = "active-request-scorer",
  schema = {
    idleThreshold = { type = "integer", default = 0, min = 0, fallback = 0,
      description = "endpoints with at most this many requests in flight score 1" },
    maxBusyScore = { type = "number", default = 1.0, min = 0, max = 1,
      description = "the score of the least busy endpoint above idleThreshold" },
    requestTimeout = { type = "any",
      description = "accepted for llm-d configs and ignored: counts are released at finish" },
  },

  new = function(params)
    return { params = params, counts = {} } -- endpoint name -> requests in flight
  end,

  -- On hot reload, share the counts: requests still pinned to the old
  -- generation release into the same table.
  migrate = function(self, old)
    self.counts = old.counts
  end,

  score = function(self, _, endpoints)
    local counts, idle, busy = self.counts, self.params.idleThreshold, self.params.maxBusyScore
    local n, c, max = #endpoints, {}, 0
    for i = 1, n do
      c[i] = counts[endpoints[i].name] or 0
      max = math.max(max, c[i])
    end
    local scores = {}
    for i = 1, n do
      scores[i] = c[i] <= idle and 1 or busy * (max - c[i]) / max
    end
    return scores
  end,

  pre_request = function(self, ctx, result)
    local counts, held = self.counts, {}
    ctx.plugin.held = held -- first: whatever is counted below is released
    for _, res in pairs(result.profiles) do
      local ep = res and res.endpoints[1]
      if ep then
        local name = ep.name
        held[#held + 1] = name
        counts[name] = (counts[name] or 0) + 1
      end
    end
  end,

  finish = function(self, ctx)
    local held = ctx.plugin.held
    if held then
      ctx.plugin.held = nil
      for _, name in ipairs(held) do
        release(self.counts, name)
      end
    end
  end,
}

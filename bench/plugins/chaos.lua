-- Bench plugin: failure injection at every stage of the scheduler and request
-- control, at random, to show that state never outlives a request whatever
-- path it takes.  Each rate is a probability per request.
local random = math.random

return {
  type = "chaos",
  schema = {
    rejectRate = { type = "number", default = 0, min = 0, max = 1 },
    emptyRate = { type = "number", default = 0, min = 0, max = 1 },
    errorRate = { type = "number", default = 0, min = 0, max = 1 },
  },

  admit = function(self, ctx)
    ctx.plugin.admitted = true
    if random() < self.params.rejectRate then
      return false, 429, "chaos: shed"
    end
  end,

  filter = function(self, ctx, endpoints)
    ctx.cycle.seen = #endpoints
    if random() < self.params.emptyRate then
      return {}
    end
    return endpoints
  end,

  score = function(self, ctx, endpoints)
    if random() < self.params.errorRate then
      error("chaos: scorer error")
    end
    ctx.shared.scored = (ctx.shared.scored or 0) + 1
    local s = {}
    for i = 1, #endpoints do
      s[i] = random()
    end
    return s
  end,

  pre_request = function(self, ctx)
    if random() < self.params.errorRate then
      error("chaos: pre_request error")
    end
    ctx.plugin.forwarded = true
  end,

  finish = function(self)
    if random() < self.params.errorRate then
      error("chaos: finish error")
    end
  end,
}

-- Prefers endpoints with fewer tokens in flight through this gateway: score
-- 1 − min(1, tokens / queueThresholdTokens).  pre_request adds the request's
-- estimated tokens against each profile's chosen endpoint and remembers them
-- in the request's private state; finish releases exactly that on every path.
--
-- Estimate: ceil(prompt characters / 4) + max_tokens (or
-- max_completion_tokens; 0 when neither is a non-negative number).  The
-- prompt is the completion prompt or, for chat, the JSON of the messages.
local function estimate(request)
  local body = request.body or {}
  local out = body.max_tokens
  if type(out) ~= "number" then
    out = body.max_completion_tokens
  end
  if type(out) ~= "number" or out ~= out or out < 0 then
    out = 0
  end
  return math.ceil(#request.prompt / 4) + math.floor(out)
end

---@type lupin.Plugin
return {
  type = "token-load-scorer",
  estimate = estimate,
  schema = {
    queueThresholdTokens = { type = "integer", default = 4194304, min = 1,
      description = "tokens in flight at which an endpoint scores 0" },
  },

  new = function(params)
    return { params = params, tokens = {} } -- endpoint name -> tokens in flight
  end,

  migrate = function(self, old)
    self.tokens = old.tokens
  end,

  score = function(self, _, endpoints)
    local tokens, t = self.tokens, self.params.queueThresholdTokens
    local scores = {}
    for i = 1, #endpoints do
      scores[i] = 1 - math.min(1, (tokens[endpoints[i].name] or 0) / t)
    end
    return scores
  end,

  pre_request = function(self, ctx, result)
    local n = estimate(ctx.request)
    local tokens, held = self.tokens, {}
    ctx.plugin.held, ctx.plugin.tokens = held, n -- first: whatever is added is released
    for _, res in pairs(result.profiles) do
      local ep = res and res.endpoints[1]
      if ep then
        held[#held + 1] = ep.name
        tokens[ep.name] = (tokens[ep.name] or 0) + n
      end
    end
  end,

  finish = function(self, ctx)
    local held, n = ctx.plugin.held, ctx.plugin.tokens
    if held then
      ctx.plugin.held = nil
      for _, name in ipairs(held) do
        local left = (self.tokens[name] or 0) - n
        self.tokens[name] = left > 0 and left or nil
      end
    end
  end,
}

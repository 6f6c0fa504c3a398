-- Prefers endpoints with fewer tokens in flight through this gateway, this
-- request's included: score 1 − min(1, (in flight + this request's uncached
-- tokens there) / queueThresholdTokens), as llm-d's scorer adds the current
-- request's load.  pre_request sets the request's estimated tokens on each
-- profile's chosen endpoint (ctx:set_in_flight_tokens): ep.in_flight_tokens,
-- one counter per endpoint shared by every worker of the process, holds them
-- until the request ends, when the core releases them on every path.
--
-- Estimate: ceil(prompt characters / 4) + max_tokens (or
-- max_completion_tokens; 0 when neither is a non-negative number).  The
-- prompt is the completion prompt or, for chat, the JSON of the messages.
-- Uncached on an endpoint: the estimate less the prompt blocks the prefix
-- scorer named prefixPluginName matched there (4 characters a token).
--
-- With an inflight-load-producer (the one inFlightLoadProducerName names,
-- else one named inflight-load-producer, else the only one: lupin.datalayer
-- sets self.inflight), the request's tokens on an endpoint are the ones it
-- published, and it holds them on the endpoints: this scorer sets nothing.
local CHARS_PER_TOKEN = 4

local function estimate(request)
  local body = request.body or {}
  local out = body.max_tokens
  if type(out) ~= "number" then
    out = body.max_completion_tokens
  end
  if type(out) ~= "number" or out ~= out or out < 0 then
    out = 0
  end
  return math.ceil(#request.prompt / CHARS_PER_TOKEN) + math.floor(out)
end

-- This request's tokens on ep: the estimate less what ep has cached.
local function uncached(n, st, ep)
  if not st then
    return n
  end
  local cached = (st.matches[ep.id] or 0) * st.block_size / CHARS_PER_TOKEN
  return math.max(0, n - math.floor(cached))
end

---@type lupin.Plugin
return {
  type = "token-load-scorer",
  estimate = estimate,
  schema = {
    queueThresholdTokens = { type = "integer", default = 4194304, min = 1, fallback = 4194304,
      description = "tokens in flight at which an endpoint scores 0" },
    prefixPluginName = { type = "string", default = "prefix-cache-scorer",
      description = "the prefix-cache-scorer instance whose matches tell the cached tokens" },
    inFlightLoadProducerName = { type = "string",
      description = "the inflight-load-producer whose estimate is read (default: one named"
        .. " inflight-load-producer, else the only one, else the scorer's own)" },
  },

  new = function(params)
    return { params = params }
  end,

  score = function(self, ctx, endpoints)
    local t = self.params.queueThresholdTokens
    local scores = {}
    if self.inflight then
      local pub = ctx.shared[self.inflight]
      local mine = pub and pub.tokens or {}
      for i, ep in ipairs(endpoints) do
        scores[i] = 1 - math.min(1, (ep.in_flight_tokens + (mine[ep.id] or 0)) / t)
      end
      return scores
    end
    local n, st = estimate(ctx.request), ctx.shared[self.params.prefixPluginName]
    for i, ep in ipairs(endpoints) do
      local load = ep.in_flight_tokens + uncached(n, st, ep)
      scores[i] = 1 - math.min(1, load / t)
    end
    return scores
  end,

  -- set, not added: an endpoint two profiles chose holds the estimate once
  pre_request = function(self, ctx, result)
    if self.inflight then -- the producer holds its estimate
      return
    end
    local n = estimate(ctx.request)
    for _, res in pairs(result.profiles) do
      local ep = res and res.endpoints[1]
      if ep then
        ctx:set_in_flight_tokens(ep, n)
      end
    end
  end,
}

-- llm-d-router's prefix-based-pd-decider, for disagg-profile-handler's
-- deciders.prefill: prefill runs on its own endpoint when the part of the
-- prompt the chosen decode endpoint has not cached is at least
-- nonCachedTokens tokens.  0 (the default) disables it: never.  With
-- promptTokens > 0 a prompt shorter than that stays on decode whatever it
-- has cached (0: no such gate).  Tokens are
-- characters / 4 and the cached part is the prefix matches' blocks, as
-- upstream; with no prefix plugin in the config nothing counts as cached.
local disagg = require "lupin.disagg"

---@type lupin.Plugin
return {
  type = "prefix-based-pd-decider",
  schema = {
    nonCachedTokens = { type = "integer", default = 0, min = 0,
      description = "uncached prompt tokens from which prefill runs apart; 0: never" },
    promptTokens = { type = "integer", default = 0, min = 0,
      description = "prompt tokens below which prefill never runs apart; 0: no minimum" },
    prefixPluginName = { type = "string",
      description = "lupin: the prefix producer or scorer whose matches count as cached"
        .. " (default: approx-prefix-cache-producer, else prefix-cache-scorer)" },
  },

  new = function(p, env)
    if p.nonCachedTokens == 0 then
      env.log("info", "nonCachedTokens is 0: prefill never runs apart")
    end
    return { min = p.nonCachedTokens, min_prompt = p.promptTokens, source = p.prefixPluginName }
  end,

  disaggregate = function(self, ctx, decode_ep)
    if self.min == 0 then
      return false
    end
    local tokens = disagg.prompt_tokens(ctx)
    if tokens < self.min or tokens < self.min_prompt then
      return false
    end
    return tokens - disagg.cached_tokens(ctx, decode_ep, self.source) >= self.min
  end,
}

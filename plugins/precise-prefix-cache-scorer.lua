-- llm-d's precise-prefix-cache-scorer: scores endpoints by the fraction of
-- the prompt their engine holds now, as its own KV-cache events say
-- (docs/kv-events.md).  The host subscribes to every endpoint's events;
-- the request's token ids come from the prompt or the engine's /tokenize;
-- where either is missing the approximate index answers (lupin.precise).
local precise = require "lupin.precise"

---@type lupin.Plugin
return {
  type = "precise-prefix-cache-scorer",
  schema = precise.SCHEMA,

  new = function(p, env)
    return precise.new(precise.settings(p, env), env)
  end,

  prepare = function(self, ctx, endpoints)
    precise.match(self, ctx, endpoints)
  end,

  score = function(self, ctx, endpoints)
    return precise.scores(self, precise.match(self, ctx, endpoints), endpoints)
  end,

  pre_request = function(self, ctx, result)
    precise.record(self, ctx, result)
  end,
}

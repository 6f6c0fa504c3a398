-- llm-d-router's precise-prefix-cache-producer: the matching half of
-- precise-prefix-cache-scorer, for configs that split producer and scorer.
-- Before the profiles run it matches the prompt against what the engines'
-- KV-cache events say they hold (docs/kv-events.md) and publishes
-- { block_size, total, matches, prompt_length, precise, how } in ctx.shared
-- under its name, the shape prefix-cache-scorer reads through
-- prefixMatchInfoProducerName.
local precise = require "lupin.precise"

---@type lupin.Plugin
return {
  type = "precise-prefix-cache-producer",
  schema = precise.SCHEMA,

  new = function(p, env)
    return precise.new(precise.settings(p, env), env)
  end,

  prepare = function(self, ctx, endpoints)
    precise.match(self, ctx, endpoints)
  end,

  pre_request = function(self, ctx, result)
    precise.record(self, ctx, result)
  end,
}

-- llm-d-router's token-producer (it renders prompts to token IDs on the model
-- servers or estimates them).  lupin runs no tokenizer: the precise prefix plugins ask
-- the endpoints' /tokenize, the others estimate tokens from characters (4 a
-- token), so the plugin loads so configs port, and does
-- nothing (docs/epp-compatibility.md).
---@type lupin.Plugin
return {
  type = "token-producer",
  -- upstream lists it in profiles: its entry there is skipped with a warning
  data_producer = true,
  schema = {
    modelName = { type = "string", description = "accepted, ignored" },
    backend = { type = "string", description = "accepted, ignored" },
    vllm = { type = "object", description = "accepted, ignored" },
    sglang = { type = "object", description = "accepted, ignored" },
    hf = { type = "object", description = "accepted, ignored" },
    ["local"] = { type = "object", description = "accepted, ignored" },
    tokenizersPoolConfig = { type = "object", description = "accepted, ignored" },
  },

  new = function(_, env)
    env.log("info", "%s: accepted, no effect: the precise prefix plugins tokenize through"
      .. " the endpoints, the others estimate tokens from characters",
      env.type)
    return {}
  end,
}

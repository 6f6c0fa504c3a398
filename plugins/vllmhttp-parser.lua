-- llm-d-router's parser of vLLM's own HTTP routes (not OpenAI's), named so
-- its configs load: upstream's /inference/v1/generate (token_ids), and in
-- lupin the other vLLM routes lupin serve proxies: /tokenize, /detokenize,
-- /pooling, /classify, /score, /rerank (with their /v1/, /v2/ forms).  The
-- parsing is the runtime's (lua/lupin/runtime/openai.lua); which parser
-- reads which path, lupin.runtime.parsers.  It is no filter, scorer or picker.
---@type lupin.Plugin
return {
  type = "vllmhttp-parser",
  schema = {},
}

-- The EPP's OpenAI parser, named so its configs load: it claims the OpenAI
-- routes (completions, chat completions and their /render, embeddings,
-- responses, audio), each body checked by its row at begin when the host
-- asks (lua/lupin/runtime/openai.lua).  Which parser reads which path:
-- requestHandler.parsers (lupin.runtime.parsers).  It is no filter, scorer or
-- picker.
---@type lupin.Plugin
return {
  type = "openai-parser",
  schema = {},
}

-- llm-d-router's Anthropic parser, named so its configs load: it claims
-- /v1/messages (checked by the runtime's row: model, messages, max_tokens;
-- the system prompt and messages feed the prefix scorer) and
-- /v1/messages/count_tokens (forwarded as sent).  The parsing is the
-- runtime's (lua/lupin/runtime/openai.lua); which parser reads which path,
-- lupin.runtime.parsers.  It is no filter, scorer or picker.
---@type lupin.Plugin
return {
  type = "anthropic-parser",
  schema = {},
}

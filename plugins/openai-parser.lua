-- The EPP's default request parser, named so its configs load: plugins:
-- [{type: openai-parser}] and parser: {pluginRef: ...}.  The parsing itself is
-- the runtime's (lua/lupin/runtime/openai.lua: one row per API route, the body
-- checked at begin when the host asks); this instance only marks the choice,
-- which lupin.config reads.  It is no filter, scorer or picker.
---@type lupin.Plugin
return {
  type = "openai-parser",
  schema = {},
}

-- The EPP's passthrough parser: the body is never read, so any format passes
-- (no 400s), ctx.request.body is false and payload-aware plugins
-- (prefix-cache-scorer) see an empty prompt, as upstream.  The model
-- comes from a header (modelHeader; Body-Based Routing's x-gateway-model-name
-- by default), else from the config (model), else none.  It claims no path:
-- listed in requestHandler.parsers (last, as by default), it takes every
-- path the parsers before it do not; lupin.runtime.parsers reads the
-- parameters.
---@type lupin.Plugin
return {
  type = "passthrough-parser",
  schema = {
    modelHeader = { type = "string", default = "x-gateway-model-name",
      description = "the request header naming the model (lupin's own parameter)" },
    model = { type = "string", description = "the model when the header is absent (lupin's own)" },
  },
}

-- GIE's request-attribute-reporter reports values computed from the
-- response's usage (CEL expressions) to Envoy as dynamic metadata.  lupin
-- serve is the proxy itself, with no Envoy to report to: the plugin loads so
-- configs port, its attributes are checked, and it does nothing.
---@type lupin.Plugin
return {
  type = "request-attribute-reporter",
  schema = {
    attributes = { type = "array", items = "object", default = {},
      description = "{key = {namespace, name}, expression, condition}: checked, not reported" },
  },

  new = function(params, env)
    for i, a in ipairs(params.attributes) do
      local where = ("attributes[%d]"):format(i - 1)
      if type(a.key) ~= "table" or type(a.key.name) ~= "string" or a.key.name == "" then
        error(where .. ": key.name must be a non-empty string", 0)
      end
      if a.key.namespace ~= nil and type(a.key.namespace) ~= "string" then
        error(where .. ": key.namespace must be a string", 0)
      end
      if type(a.expression) ~= "string" or not a.expression:find("%S") then
        error(where .. ": expression must be a non-empty CEL expression", 0)
      end
      if a.condition ~= nil and type(a.condition) ~= "string" then
        error(where .. ": condition must be a CEL expression", 0)
      end
    end
    if #params.attributes > 0 then
      env.log("info", "request-attribute-reporter: %d attribute(s) not reported: lupin has no"
        .. " Envoy dynamic metadata", #params.attributes)
    end
    return {}
  end,
}

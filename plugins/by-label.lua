-- llm-d's by-label filter: keeps endpoints whose label `label` has one of
-- `validValues`; endpoints without the label are kept only when
-- `allowsNoLabel` is true.
---@type lupin.Plugin
return {
  type = "by-label",
  schema = {
    label = { type = "string", required = true, description = "the label's name" },
    validValues = { type = "array", items = "string", default = {},
      description = "the values that keep an endpoint" },
    allowsNoLabel = { type = "boolean", default = false,
      description = "keep endpoints that do not have the label" },
  },

  new = function(params)
    if params.label == "" then
      error("label must be a non-empty string", 0)
    end
    if #params.validValues == 0 and not params.allowsNoLabel then
      error("validValues is empty and allowsNoLabel is false: the filter would remove every"
        .. " endpoint", 0)
    end
    local valid = {}
    for _, v in ipairs(params.validValues) do
      valid[v] = true
    end
    return { label = params.label, valid = valid, allows_no_label = params.allowsNoLabel }
  end,

  filter = function(self, _, endpoints)
    local kept = {}
    for _, ep in ipairs(endpoints) do
      local v = ep.labels and ep.labels[self.label]
      if (v == nil and self.allows_no_label) or (v ~= nil and self.valid[v]) then
        kept[#kept + 1] = ep
      end
    end
    return kept
  end,
}

-- llm-d's label-selector-filter (by-label-selector under its newer name):
-- keeps endpoints whose labels satisfy a Kubernetes label selector,
-- {matchLabels, matchExpressions} (In, NotIn, Exists, DoesNotExist); an
-- empty selector keeps every endpoint.
local selector = require "lupin.selector"

---@type lupin.Plugin
return {
  type = "label-selector-filter",
  schema = {
    matchLabels = { type = "object", default = {}, description = "label -> value, all equal" },
    matchExpressions = { type = "array", items = "object", default = {},
      description = "{key, operator, values}, all true" },
  },

  new = function(params)
    local match, err = selector.compile(params)
    if not match then
      error(err, 0)
    end
    return { match = match }
  end,

  filter = function(self, _, endpoints)
    local kept = {}
    for _, ep in ipairs(endpoints) do
      if self.match(ep.labels) then
        kept[#kept + 1] = ep
      end
    end
    return kept
  end,
}

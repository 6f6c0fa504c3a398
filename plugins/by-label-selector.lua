-- llm-d's by-label-selector filter: keeps endpoints whose labels satisfy a
-- Kubernetes label selector, {matchLabels, matchExpressions} (In, NotIn,
-- Exists, DoesNotExist); an empty selector keeps every endpoint.
local selector = require "lupin.selector"

---@type lupin.Plugin
return {
  type = "by-label-selector",
  schema = selector.SCHEMA,
  new = selector.new,
  filter = selector.filter,
}

-- llm-d's label-selector-filter: by-label-selector under its newer name.
local selector = require "lupin.selector"

---@type lupin.Plugin
return {
  type = "label-selector-filter",
  schema = selector.SCHEMA,
  new = selector.new,
  filter = selector.filter,
}

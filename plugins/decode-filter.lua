-- llm-d's decode filter: keeps endpoints that can decode, i.e. whose
-- `llm-d.ai/role` label is `decode` or `both`, or that have no role label.
local ROLE = "llm-d.ai/role"

---@type lupin.Plugin
return {
  type = "decode-filter",
  schema = {},

  filter = function(_, _, endpoints)
    local kept = {}
    for _, ep in ipairs(endpoints) do
      local role = ep.labels and ep.labels[ROLE]
      if role == nil or role == "decode" or role == "both" then
        kept[#kept + 1] = ep
      end
    end
    return kept
  end,
}

-- llm-d's prefill filter: keeps endpoints whose `llm-d.ai/role` label is
-- `prefill`; endpoints without the label are removed.
local ROLE = "llm-d.ai/role"

---@type lupin.Plugin
return {
  type = "prefill-filter",
  schema = {},

  filter = function(_, _, endpoints)
    local kept = {}
    for _, ep in ipairs(endpoints) do
      if ep.labels and ep.labels[ROLE] == "prefill" then
        kept[#kept + 1] = ep
      end
    end
    return kept
  end,
}

-- llm-d's decode filter: keeps endpoints that can decode, i.e. whose
-- `llm-d.ai/role` label is decode, prefill-decode, encode-prefill-decode or
-- the deprecated both, or that have no role label (llm-d-router's roles).
local ROLE = "llm-d.ai/role"
local DECODES = { decode = true, ["prefill-decode"] = true, ["encode-prefill-decode"] = true,
  both = true }

---@type lupin.Plugin
return {
  type = "decode-filter",
  schema = {},

  filter = function(_, _, endpoints)
    local kept = {}
    for _, ep in ipairs(endpoints) do
      local role = ep.labels and ep.labels[ROLE]
      if role == nil or DECODES[role] then
        kept[#kept + 1] = ep
      end
    end
    return kept
  end,
}

-- llm-d-router's encode filter: keeps endpoints whose `llm-d.ai/role` label
-- is encode, encode-prefill or encode-prefill-decode (the first stage of
-- E/P/D); endpoints without the label are removed.
local ROLE = "llm-d.ai/role"
local ENCODES = { encode = true, ["encode-prefill"] = true, ["encode-prefill-decode"] = true }

---@type lupin.Plugin
return {
  type = "encode-filter",
  schema = {},

  filter = function(_, _, endpoints)
    local kept = {}
    for _, ep in ipairs(endpoints) do
      if ep.labels and ENCODES[ep.labels[ROLE]] then
        kept[#kept + 1] = ep
      end
    end
    return kept
  end,
}

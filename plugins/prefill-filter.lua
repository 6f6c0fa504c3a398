-- llm-d's prefill filter: keeps endpoints whose `llm-d.ai/role` label is
-- prefill, encode-prefill, prefill-decode, encode-prefill-decode or the
-- deprecated both (llm-d-router's roles); endpoints without the label are
-- removed.
local ROLE = "llm-d.ai/role"
local PREFILLS = { prefill = true, ["encode-prefill"] = true, ["prefill-decode"] = true,
  ["encode-prefill-decode"] = true, both = true }

---@type lupin.Plugin
return {
  type = "prefill-filter",
  schema = {},

  filter = function(_, _, endpoints)
    local kept = {}
    for _, ep in ipairs(endpoints) do
      if ep.labels and PREFILLS[ep.labels[ROLE]] then
        kept[#kept + 1] = ep
      end
    end
    return kept
  end,
}

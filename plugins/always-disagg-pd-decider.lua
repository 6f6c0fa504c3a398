-- llm-d-router's always-disagg-pd-decider: prefill always runs on its own
-- endpoint (disagg-profile-handler's deciders.prefill).
---@type lupin.Plugin
return {
  type = "always-disagg-pd-decider",
  schema = {},

  disaggregate = function()
    return true
  end,
}

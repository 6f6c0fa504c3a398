-- Tells the decode endpoint where the prompt was prefilled: sets
-- x-prefiller-host-port to the prefill profile's endpoint when that profile
-- ran and picked one (llm-d's prefill-header-handler; its sidecar reads it).
---@type lupin.Plugin
return {
  type = "prefill-header-handler",
  schema = {
    prefillProfile = { type = "string", default = "prefill",
      description = "the profile whose endpoint prefills" },
  },

  new = function(p)
    return { profile = p.prefillProfile }
  end,

  pre_request = function(self, ctx, result)
    local res = result.profiles[self.profile]
    local ep = res and res.endpoints[1]
    if ep then
      ctx:set_header("x-prefiller-host-port", ep.hostport)
    end
  end,
}

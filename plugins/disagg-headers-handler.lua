-- llm-d-router's disagg-headers-handler (deprecated upstream: the
-- disagg-profile-handler writes the same headers): x-prefiller-host-port
-- names the prefill profile's endpoint, x-encoder-hosts-ports the encode
-- profile's endpoints, for the stages that ran.
local disagg = require "lupin.disagg"

---@type lupin.Plugin
return {
  type = "disagg-headers-handler",
  schema = {
    prefillProfile = { type = "string", default = "prefill",
      description = "the profile whose pick is x-prefiller-host-port" },
    encodeProfile = { type = "string", default = "encode",
      description = "the profile whose picks are x-encoder-hosts-ports" },
  },

  new = function(p)
    return { prefill = p.prefillProfile, encode = p.encodeProfile }
  end,

  pre_request = function(self, ctx, result)
    disagg.set_headers(ctx, result, self.prefill, self.encode)
  end,
}

-- llm-d-router's data-parallel-profile-handler: one scheduling profile, whose
-- pick is a data-parallel rank (an endpoint per rank port).  The request goes
-- to primaryPort of the rank's address, the rank's server, which forwards it
-- to the rank named by x-data-parallel-host-port.  Upstream sends to port
-- "0" with primaryPort 0; lupin keeps the rank's own port then.
local disagg = require "lupin.disagg"

---@type lupin.Plugin
return {
  type = "data-parallel-profile-handler",
  schema = {
    primaryPort = { type = "integer", default = 8000, min = 0, max = 65535,
      description = "the port of the rank's address requests go to; 0: the rank's own" },
  },

  new = function(p)
    return { port = p.primaryPort > 0 and p.primaryPort or nil }
  end,

  pick_profiles = function(_, _, profiles, results)
    local name, n = nil, 0
    for k in pairs(profiles) do
      name, n = k, n + 1
    end
    if n ~= 1 then
      error(("needs exactly one scheduling profile, the config has %d"):format(n))
    end
    if results[name] ~= nil then
      return {}
    end
    return { name }
  end,

  process_results = function(self, ctx, results)
    local name, res = next(results)
    if res then
      ctx:set_header(disagg.DP_HEADER, res.endpoints[1].hostport)
    end
    return { primary = name, port = self.port }
  end,
}

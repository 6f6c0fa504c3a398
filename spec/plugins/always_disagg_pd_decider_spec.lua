-- always-disagg-pd-decider: prefill apart for every request.  llm-d/llm-d-router
-- pkg/epp/framework/plugins/scheduling/profilehandler/disagg/always_disagg_pd_decider.go;
-- through the handler: disagg_profile_handler_spec.lua.
local S = require "support"

describe("always-disagg-pd-decider", function()
  it("says yes whatever the request and endpoint, and takes no parameters", function()
    local rt = S.runtime()
    local v = S.eval(rt, ([[
      local m = require("lupin.generation.loader").load(%q, "always-disagg-pd-decider")
      local ok, err = require("lupin.schema").validate(m.schema, { nonCachedTokens = 1 })
      return { m.disaggregate(m, { request = { prompt = "" }, shared = {} }, { id = 1 }),
        ok == nil and err or "accepted" }
    ]]):format(S.ROOT .. "/plugins/always-disagg-pd-decider.lua"))
    rt:free()
    assert.is_true(v[1])
    assert.matches("nonCachedTokens", v[2])
  end)
end)

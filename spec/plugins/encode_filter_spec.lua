-- encode-filter: the encode role's endpoints.  llm-d/llm-d-router
-- pkg/epp/framework/plugins/scheduling/filter/bylabel/roles.go NewEncodeRole:
-- encode, encode-prefill, encode-prefill-decode; no label: removed.
local S = require "support"
local P = require "prefix_support"

local ROLES = { "encode", "encode-prefill", "encode-prefill-decode", "prefill", "decode",
  "prefill-decode", "both", false }

describe("encode-filter", function()
  it("keeps encode, encode-prefill and encode-prefill-decode only", function()
    local rt = S.loaded(P.config({ "encode-filter" }))
    local eps = {}
    for i, role in ipairs(ROLES) do
      eps[i] = { labels = role and { ["llm-d.ai/role"] = role } or nil }
    end
    S.endpoints(rt, #ROLES, eps)
    local _, scores, res = P.request(rt, "hello")
    rt:free()
    assert.equal(200, res.status)
    assert.same({ ep1 = 0, ep2 = 0, ep3 = 0 }, scores)
  end)

  it("takes no parameters", function()
    assert.matches("unknown parameter", P.config_error("encode-filter", { role = "encode" }))
  end)
end)

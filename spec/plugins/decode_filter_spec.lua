local K = require "plugins.kit"
local S = require "support"

local T = "decode-filter"
local ROLES = {
  { labels = { ["llm-d.ai/role"] = "decode" } },
  { labels = { ["llm-d.ai/role"] = "prefill" } },
  { labels = { ["llm-d.ai/role"] = "both" } },
  { labels = { zone = "a" } }, -- no role label
  { labels = { ["llm-d.ai/role"] = "Decode" } }, -- values are case-sensitive
}

describe(T, function()
  it("keeps decode, both and unlabelled endpoints, in order", function()
    local rt = K.pool(6, ROLES) -- ep6 has no labels at all
    assert.same({ "ep1", "ep3", "ep4", "ep6" }, K.call(rt, { type = T, point = "filter" }).kept)
  end)

  -- llm-d-router pkg/epp/framework/plugins/scheduling/filter/bylabel/roles_test.go,
  -- TestRoleFilterDecodeRole: the newest role values.
  it("keeps decode, prefill-decode, encode-prefill-decode and unlabelled; not encode", function()
    local names = { "decode", "prefill", "prefill-decode", "encode-prefill-decode", "encode",
      "encode-prefill" }
    local roles = {}
    for i, r in ipairs(names) do
      roles[i] = { labels = { ["llm-d.ai/role"] = r } }
    end
    roles[#roles + 1] = { labels = { app = "vllm" } }
    local rt = K.pool(#roles + 1, roles) -- the last has no labels at all
    assert.same({ "ep1", "ep3", "ep4", "ep7", "ep8" }, K.call(rt, { type = T, point = "filter" }).kept)
  end)

  it("keeps nothing from nothing, and nothing from prefill-only pools", function()
    local rt = K.pool(2, { ROLES[2], ROLES[2] })
    assert.same({}, K.call(rt, { type = T, point = "filter" }).kept)
    assert.same({}, K.call(rt, { type = T, point = "filter", names = {} }).kept)
  end)

  it("takes no parameters", function()
    local err = K.load_error({ '{"type": "decode-filter", "parameters": {"label": "x"}}' })
    assert.matches("^spec%.json:3: plugins%[0%]%.parameters%.label: unknown parameter", err)
  end)

  it("filters end to end; a prefill-only pool is a 503 naming the filter", function()
    local rt = S.loaded(K.config({ { type = T },
      { type = "max-score-picker", parameters = { maxNumOfEndpoints = 10 } } },
      { { pluginRef = T }, { pluginRef = "max-score-picker" } }))
    S.endpoints(rt, 3, { ROLES[2], ROLES[1], ROLES[2] })
    assert.same({ "ep2" }, (K.picks(rt)))
    rt:remove("ep2")
    local _, res = K.picks(rt)
    assert.equal(503, res.status)
    assert.equal(T, res.plugin)
    assert.matches('filter "decode%-filter" removed the last 2', res.message)
  end)
end)

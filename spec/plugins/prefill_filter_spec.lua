local K = require "plugins.kit"
local S = require "support"

local T = "prefill-filter"

describe(T, function()
  it("keeps endpoints whose role can prefill, including the deprecated both", function()
    local rt = K.pool(6, {
      { labels = { ["llm-d.ai/role"] = "prefill" } },
      { labels = { ["llm-d.ai/role"] = "decode" } },
      { labels = { ["llm-d.ai/role"] = "both" } },
      { labels = { zone = "a" } },
      { labels = { ["llm-d.ai/role"] = "prefill", zone = "b" } },
    }) -- ep6: no labels
    assert.same({ "ep1", "ep3", "ep5" }, K.call(rt, { type = T, point = "filter" }).kept)
    assert.same({}, K.call(rt, { type = T, point = "filter", names = {} }).kept)
    assert.same({}, K.call(rt, { type = T, point = "filter", names = { "ep4", "ep6" } }).kept)
  end)

  -- llm-d-router pkg/epp/framework/plugins/scheduling/filter/bylabel/roles_test.go,
  -- TestRoleFilterPrefillRole: the newest role values.
  it("keeps prefill, prefill-decode, encode-prefill-decode and encode-prefill; not encode", function()
    local names = { "decode", "prefill", "prefill-decode", "encode-prefill-decode", "encode",
      "encode-prefill" }
    local roles = {}
    for i, r in ipairs(names) do
      roles[i] = { labels = { ["llm-d.ai/role"] = r } }
    end
    roles[#roles + 1] = { labels = { app = "vllm" } }
    local rt = K.pool(#roles, roles)
    assert.same({ "ep2", "ep3", "ep4", "ep6" }, K.call(rt, { type = T, point = "filter" }).kept)
  end)

  it("takes no parameters", function()
    local err = K.load_error({ '{"type": "prefill-filter", "parameters": {"x": true}}' })
    assert.matches("^spec%.json:3: plugins%[0%]%.parameters%.x: unknown parameter", err)
  end)

  it("filters end to end", function()
    local rt = S.loaded(K.config({ { type = T },
      { type = "max-score-picker", parameters = { maxNumOfEndpoints = 10 } } },
      { { pluginRef = T }, { pluginRef = "max-score-picker" } }))
    S.endpoints(rt, 2, { { labels = { ["llm-d.ai/role"] = "decode" } },
      { labels = { ["llm-d.ai/role"] = "prefill" } } })
    assert.same({ "ep2" }, (K.picks(rt)))
  end)
end)

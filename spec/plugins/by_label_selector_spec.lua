-- llm-d's by-label-selector filter on the vectors of llm-d-inference-scheduler
-- pkg/plugins/filter/by_label_selector_test.go, now llm-d-router
-- pkg/epp/framework/plugins/scheduling/filter/bylabel/selector_test.go
-- (TestLabelSelectorFilter*: the same cases), and under its newer name,
-- label-selector-filter (spec/plugins/label_selector_filter_spec.lua), the
-- same vectors: both types are one filter.
local K = require "plugins.kit"

-- TestByLabelSelectorFiltering's five endpoints
local POOL = {
  { labels = { app = "nginx", version = "v1.0", tier = "frontend" } }, -- nginx-1
  { labels = { app = "nginx", version = "v1.1", tier = "frontend" } }, -- nginx-2
  { labels = { app = "coredns", tier = "system" } }, -- coredns-1
  { labels = { app = "redis", tier = "backend", deprecated = "true" } }, -- redis-1
  { labels = { app = "web", tier = "frontend", environment = "production" } }, -- web-1
}
local NAMES = { ep1 = "nginx-1", ep2 = "nginx-2", ep3 = "coredns-1", ep4 = "redis-1",
  ep5 = "web-1" }

for _, T in ipairs({ "by-label-selector", "label-selector-filter" }) do
  describe(T, function()
    local function kept(rt, params, names)
      local out = {}
      for i, n in ipairs(K.call(rt, { type = T, params = params, point = "filter",
        names = names }).kept) do
        out[i] = NAMES[n] or n
      end
      return out
    end

    -- TestByLabelSelectorFiltering: each case's selector and expected pods
    it("matches as TestByLabelSelectorFiltering expects", function()
      local rt = K.pool(5, POOL)
      local function ex(key, op, values)
        return { matchExpressions = { { key = key, operator = op, values = values } } }
      end
      assert.same({ "nginx-1", "nginx-2" }, kept(rt, { matchLabels = { app = "nginx" } }))
      assert.same({ "nginx-1" }, kept(rt, { matchLabels = { app = "nginx", version = "v1.0" } }))
      assert.same({ "nginx-1", "nginx-2", "redis-1", "web-1" },
        kept(rt, ex("tier", "In", { "frontend", "backend" })))
      assert.same({ "nginx-1", "nginx-2", "redis-1", "web-1" },
        kept(rt, ex("tier", "NotIn", { "system" })))
      assert.same({ "redis-1" }, kept(rt, ex("deprecated", "Exists")))
      assert.same({ "nginx-1", "nginx-2", "coredns-1", "web-1" },
        kept(rt, ex("deprecated", "DoesNotExist")))
      assert.same({ "web-1" }, kept(rt, { matchLabels = { tier = "frontend" },
        matchExpressions = { { key = "environment", operator = "Exists" } } }))
      assert.same({ "nginx-1", "nginx-2", "coredns-1", "redis-1", "web-1" }, kept(rt, {}))
      assert.same({}, kept(rt, { matchLabels = { app = "nonexistent" } }))
      rt:free()
    end)

    -- TestByLabelSelectorFilterEdgeCases
    it("keeps nothing of an empty pool or of endpoints without labels", function()
      local rt = K.pool(1)
      assert.same({}, kept(rt, { matchLabels = { app = "test" } }, {}))
      assert.same({}, kept(rt, { matchLabels = { app = "test" } }))
      rt:free()
    end)

    -- selector_test.go TestLabelSelectorFilterHasNoAllowsNoLabelEscapeHatch: a
    -- mislabelled or unlabelled endpoint does not pass an In selector
    it("keeps only the endpoint whose label is in the set, not an unlabelled one", function()
      local rt = K.pool(3, { { labels = { ["llm-d.ai/role"] = "decode" } },
        { labels = { ["llm-d.ai/role"] = "encode" } }, { labels = {} } })
      assert.same({ "ep1" }, K.call(rt, { type = T, point = "filter", params = {
        matchExpressions = { { key = "llm-d.ai/role", operator = "In",
          values = { "decode", "prefill-decode" } } } } }).kept)
      rt:free()
    end)

    -- TestByLabelSelectorFactoryWithInvalidJSON: "invalid operator"
    it("refuses an invalid operator and In without values", function()
      local err = K.load_error({ ('{"type": "%s", "parameters": {"matchExpressions": [{"key": "app",'
        .. ' "operator": "InvalidOperator", "values": ["nginx"]}]}}'):format(T) })
      assert.matches('"InvalidOperator" is not a valid label selector operator', err, 1, true)
      err = K.load_error({ ('{"type": "%s", "parameters": {"matchExpressions": [{"key": "app",'
        .. ' "operator": "In"}]}}'):format(T) })
      assert.matches("values set can't be empty", err, 1, true)
      err = K.load_error({ ('{"type": "%s", "parameters": {"matchLabel": {}}}'):format(T) })
      assert.matches('unknown parameter "matchLabel"', err, 1, true)
    end)
  end)
end

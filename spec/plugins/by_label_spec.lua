local K = require "plugins.kit"
local S = require "support"

local T = "by-label"

local function kept(rt, params, names)
  return K.call(rt, { type = T, params = params, point = "filter", names = names }).kept
end

describe(T, function()
  local pool = {
    { labels = { tier = "gold" } },
    { labels = { tier = "silver" } },
    { labels = { tier = "bronze" } },
    { labels = { zone = "a" } }, -- no tier
  }

  -- llm-d-router pkg/epp/framework/plugins/scheduling/filter/bylabel/filter_test.go,
  -- TestByLabelFiltering over its six endpoints (the selector spec's five and
  -- one without a tier)
  it("filters as TestByLabelFiltering expects", function()
    local rt = K.pool(6, {
      { labels = { app = "nginx", version = "v1.0", tier = "frontend" } },
      { labels = { app = "nginx", version = "v1.1", tier = "frontend" } },
      { labels = { app = "coredns", tier = "system" } },
      { labels = { app = "redis", tier = "backend", deprecated = "true" } },
      { labels = { app = "web", tier = "frontend", environment = "production" } },
      { labels = { app = "unknown" } },
    })
    assert.same({ "ep1", "ep2" }, kept(rt, { label = "app", validValues = { "nginx" } }))
    assert.same({ "ep1" }, kept(rt, { label = "version", validValues = { "v1.0" } }))
    assert.same({ "ep6" }, kept(rt, { label = "tier", allowsNoLabel = true }))
    assert.same({ "ep1", "ep2", "ep3", "ep4", "ep5" },
      kept(rt, { label = "tier", validValues = { "frontend", "backend", "system" } }))
  end)

  -- filter_test.go TestFactory: the three valid configs load
  it("loads TestFactory's valid configs", function()
    for _, p in ipairs({ '{"label": "llm-d.ai/role", "allowsNoLabel": false, "validValues": ["prefill"]}',
      '{"label": "llm-d.ai/role", "allowsNoLabel": true, "validValues": []}',
      '{"label": "llm-d.ai/role", "allowsNoLabel": true, "validValues": ["decode", "both"]}' }) do
      local rt = S.runtime()
      assert(rt:load_string(('{"plugins": [{"type": "by-label", "parameters": %s}]}'):format(p),
        "spec.json"))
      rt:free()
    end
  end)

  it("keeps endpoints whose label has one of validValues", function()
    local rt = K.pool(4, pool)
    assert.same({ "ep1", "ep3" }, kept(rt, { label = "tier", validValues = { "gold", "bronze" } }))
    assert.same({}, kept(rt, { label = "tier", validValues = { "platinum" } }))
    assert.same({}, kept(rt, { label = "tier", validValues = { "gold" } }, {}))
  end)

  it("keeps endpoints without the label only with allowsNoLabel", function()
    local rt = K.pool(5, pool) -- ep5: no labels at all
    assert.same({ "ep2", "ep4", "ep5" }, kept(rt, { label = "tier", validValues = { "silver" },
      allowsNoLabel = true }))
    assert.same({ "ep4", "ep5" }, kept(rt, { label = "tier", allowsNoLabel = true }))
  end)

  it("defaults validValues to [] and allowsNoLabel to false", function()
    assert.same({ label = "x", validValues = {}, allowsNoLabel = false },
      K.params(S.runtime(), T, { label = "x" }))
  end)

  it("refuses configs that are wrong or would remove every endpoint", function()
    local err = K.load_error({ '{"type": "by-label", "parameters": {"validValues": ["a"]}}' })
    assert.matches('^spec%.json:3: plugins%[0%]%.parameters%.label: missing required parameter '
      .. '"label" %(a string%)', err)
    err = K.load_error({ '{"type": "by-label", "parameters": {"label": 7, "validValues": ["a"]}}' })
    assert.matches("^spec%.json:3: plugins%[0%]%.parameters%.label: must be a string, got 7", err)
    err = K.load_error({ '{"type": "by-label", "parameters": {"label": "", "validValues": ["a"]}}' })
    assert.matches('^spec%.json:3: plugins%[0%]: plugin "by%-label" %(by%-label%) failed to start: '
      .. "label must be a non%-empty string", err)
    err = K.load_error({ '{"type": "queue-scorer"}',
      '{"type": "by-label", "parameters": {"label": "tier"}}' })
    assert.matches('^spec%.json:4: plugins%[1%]: plugin "by%-label" %(by%-label%) failed to start: '
      .. "validValues is empty and allowsNoLabel is false", err)
    err = K.load_error({ '{"type": "by-label", "parameters": {"label": "t", "validValues": [1]}}' })
    assert.matches("^spec%.json:3: plugins%[0%]%.parameters%.validValues: item 0 must be a string",
      err)
    err = K.load_error({ '{"type": "by-label", "parameters": {"label": "t", "allowsNoLabel": 1}}' })
    assert.matches("^spec%.json:3: plugins%[0%]%.parameters%.allowsNoLabel: must be a boolean", err)
  end)

  it("filters end to end", function()
    local rt = S.loaded(K.config({
      { type = T, parameters = { label = "tier", validValues = { "silver" } } },
      { type = "max-score-picker", parameters = { maxNumOfEndpoints = 10 } } },
      { { pluginRef = T }, { pluginRef = "max-score-picker" } }))
    S.endpoints(rt, 4, pool)
    assert.same({ "ep2" }, (K.picks(rt)))
  end)
end)

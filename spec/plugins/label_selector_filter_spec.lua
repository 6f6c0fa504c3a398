-- llm-d's label-selector-filter, by-label-selector's newer name: the same
-- filter (lua/lupin/selector.lua), its parameters one by one, its errors,
-- and in a config.  by_label_selector_spec.lua runs llm-d's vectors on both.
local K = require "plugins.kit"
local S = require "support"

local T = "label-selector-filter"

local POOL = {
  { labels = { app = "a", tier = "gold" } }, -- ep1
  { labels = { app = "a", tier = "silver" } }, -- ep2
  { labels = { app = "b" } }, -- ep3
}

local function kept(rt, params, names)
  return K.call(rt, { type = T, params = params, point = "filter", names = names }).kept
end

local function ex(key, op, values)
  return { matchExpressions = { { key = key, operator = op, values = values } } }
end

describe(T, function()
  it("defaults to an empty selector, which keeps every endpoint", function()
    assert.same({ matchLabels = {}, matchExpressions = {} }, K.params(S.runtime(), T, {}))
    local rt = K.pool(3, POOL)
    assert.same({ "ep1", "ep2", "ep3" }, kept(rt, {}))
    rt:free()
  end)

  it("matchLabels: every entry equal", function()
    local rt = K.pool(3, POOL)
    assert.same({ "ep1", "ep2" }, kept(rt, { matchLabels = { app = "a" } }))
    assert.same({ "ep2" }, kept(rt, { matchLabels = { app = "a", tier = "silver" } }))
    assert.same({}, kept(rt, { matchLabels = { app = "c" } }))
    rt:free()
  end)

  it("matchExpressions: In, NotIn, Exists, DoesNotExist, all true", function()
    local rt = K.pool(3, POOL)
    assert.same({ "ep1", "ep3" }, kept(rt, ex("tier", "NotIn", { "silver" })))
    assert.same({ "ep1" }, kept(rt, ex("tier", "In", { "gold", "platinum" })))
    assert.same({ "ep1", "ep2" }, kept(rt, ex("tier", "Exists")))
    assert.same({ "ep3" }, kept(rt, ex("tier", "DoesNotExist")))
    assert.same({ "ep2" }, kept(rt, { matchLabels = { app = "a" }, matchExpressions = {
      { key = "tier", operator = "NotIn", values = { "gold" } },
      { key = "app", operator = "Exists" } } }))
    rt:free()
  end)

  it("gives what by-label-selector gives", function()
    local rt = K.pool(3, POOL)
    for _, params in ipairs({ {}, { matchLabels = { app = "b" } }, ex("tier", "Exists"),
      ex("app", "NotIn", { "a" }) }) do
      assert.same(K.call(rt, { type = "by-label-selector", params = params, point = "filter" }).kept,
        kept(rt, params))
    end
    rt:free()
  end)

  it("refuses a bad selector at load, at the plugin's line", function()
    local function err_of(params)
      return K.load_error({ ('{"type": "%s", "parameters": %s}'):format(T, params) })
    end
    assert.matches('"Between" is not a valid label selector operator',
      err_of('{"matchExpressions": [{"key": "a", "operator": "Between", "values": ["x"]}]}'), 1, true)
    assert.matches("values set can't be empty",
      err_of('{"matchExpressions": [{"key": "a", "operator": "NotIn"}]}'), 1, true)
    assert.matches("values set must be empty for exists and does not exist",
      err_of('{"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]}'), 1, true)
    assert.matches("key must be a label name",
      err_of('{"matchExpressions": [{"operator": "Exists"}]}'), 1, true)
    assert.matches("matchLabels maps label names to string values",
      err_of('{"matchLabels": {"a": 1}}'), 1, true)
    local err = err_of('{"matchLabels": "a=b"}')
    assert.matches("^spec%.json:3: plugins%[0%]%.parameters%.matchLabels: must be an object", err)
    err = err_of('{"matchExpressions": ["a"]}')
    assert.matches("^spec%.json:3: plugins%[0%]%.parameters%.matchExpressions: item 0 must be an"
      .. " object", err)
    assert.matches('unknown parameter "selector"', err_of('{"selector": {}}'), 1, true)
  end)

  it("filters end to end", function()
    local rt = S.loaded(K.config({
      { type = T, parameters = { matchLabels = { app = "a" } } },
      { type = "max-score-picker", parameters = { maxNumOfEndpoints = 10 } } },
      { { pluginRef = T }, { pluginRef = "max-score-picker" } }))
    S.endpoints(rt, 3, POOL)
    local picks = K.picks(rt)
    table.sort(picks)
    assert.same({ "ep1", "ep2" }, picks)
    rt:free()
  end)
end)

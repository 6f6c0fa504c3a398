-- Parameters the EPP and llm-d replace with their default when out of range,
-- instead of refusing the config: lupin loads them the same way and logs a
-- warning naming the file, line, plugin, parameter and the value used.
local K = require "plugins.kit"
local S = require "support"

-- The parameters the generation handed to instance `name`.
local function params_of(rt, name)
  return S.eval(rt, ([[
    local gen
    for _, v in pairs(debug.getregistry()) do
      if type(v) == "table" and rawget(v, "by_name") and rawget(v, "number")
        and (not gen or v.number > gen.number) then
        gen = v
      end
    end
    return gen.by_name[%q].params
  ]]):format(name))
end

-- type, parameter, value given, value used, and the upstream code it mirrors
local CASES = {
  -- GIE pkg/epp/scheduling/framework/plugins/prefixcachescorer/plugin.go, New:
  -- "BlockSize is not positive, using default value" (and the others)
  { "prefix-cache-scorer", "blockSize", 0, 64 },
  { "prefix-cache-scorer", "hashBlockSize", -4, 64 },
  { "prefix-cache-scorer", "maxPrefixBlocksToMatch", -1, 256 },
  { "prefix-cache-scorer", "lruCapacityPerServer", 0, 31250 },
  -- llm-d-router .../scorer/loadaware/load_aware.go, NewLoadAware:
  -- "queueThreshold should be positive, using default queue threshold"
  { "load-aware-scorer", "threshold", 0, 128 },
  -- llm-d-router .../scorer/tokenload/token_load.go, TokenLoadScorerFactory
  { "token-load-scorer", "queueThresholdTokens", -5, 4194304 },
  -- llm-d-router .../scorer/nohitlru/no_hit_lru.go, NewNoHitLRU: lruSize ≤ 0
  { "no-hit-lru-scorer", "lruSize", 0, 1024 },
  -- llm-d-router .../scorer/activerequest/active_request.go, NewActiveRequest:
  -- idleThreshold < 0 keeps the default 0
  { "active-request-scorer", "idleThreshold", -1, 0 },
}

describe("parameters the EPP replaces with its default", function()
  for _, c in ipairs(CASES) do
    local type_, param, given, used = c[1], c[2], c[3], c[4]
    it(("%s %s: %s loads as %s, with a warning"):format(type_, param, given, used), function()
      local rt = S.loaded(K.config({ { type = type_, parameters = { [param] = given } } },
        { { pluginRef = type_ } }))
      assert.equal(used, params_of(rt, type_)[param])
      local warned
      for _, l in ipairs(rt:logs()) do
        if l[1] == 1 and l[2]:find(("spec.json:1: plugins[0].parameters.%s: plugin %q (%s): %s"
          .. " out of range, using %s instead, as the EPP does"):format(param, type_, type_,
          given, used), 1, true) then
          warned = true
        end
      end
      assert.is_true(warned, S.json.encode(rt:logs()))
      rt:free()
    end)
  end

  it("hands the plugin the value used", function()
    local rt = S.loaded(K.config({ { type = "prefix-cache-scorer",
      parameters = { blockSize = 0, maxPrefixBlocksToMatch = -1, autoTune = false } } },
      { { pluginRef = "prefix-cache-scorer" } }))
    assert.same({ 64, 256 }, K.instance(rt, "prefix-cache-scorer", "{ self.block, self.max_blocks }"))
    rt:free()
  end)
end)

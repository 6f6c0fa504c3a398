local S = require "support"
local P = require "prefix_support"

local function config(params)
  return {
    plugins = {
      { type = "prefix-cache-scorer", parameters = { blockSize = 4, autoTune = false } },
      { type = "prefix-cache-affinity-filter", parameters = params },
      { type = "spec-scores-picker" },
    },
    schedulingProfiles = { { name = "default", plugins = {
      { pluginRef = "prefix-cache-affinity-filter" }, { pluginRef = "spec-scores-picker" } } } },
  }
end

describe("prefix-cache-affinity-filter", function()
  local rt
  after_each(function()
    if rt then
      rt:free()
      rt = nil
    end
  end)

  -- ep1 holds aaaa, ep2 holds aaaabbbb; returns the endpoints kept for `prompt`.
  local function kept(params, prompt)
    rt = S.loaded(config(params))
    S.endpoints(rt, 3)
    P.request(rt, "aaaa", { subset = { "ep1" } })
    P.request(rt, "aaaabbbb", { subset = { "ep2" } })
    local names = {}
    for name in pairs(select(2, P.request(rt, prompt))) do
      names[#names + 1] = name
    end
    table.sort(names)
    rt:free()
    rt = nil
    return table.concat(names, ",")
  end

  -- llm-d-router .../filter/prefixcacheaffinity/plugin.go, DefaultConfig:
  -- AffinityThreshold 0.80, ExplorationProbability 0.
  it("has llm-d's defaults and refuses bad parameters", function()
    assert.same({ affinityThreshold = 0.8, explorationProbability = 0,
      prefixPluginName = "prefix-cache-scorer" }, P.defaults("prefix-cache-affinity-filter"))
    assert.matches("parameters.affinityThreshold: must be a number between 0 and 1, got 1.5",
      P.config_error("prefix-cache-affinity-filter", { affinityThreshold = 1.5 }))
    assert.matches("parameters.explorationProbability: must be a number between 0 and 1, got %-0.1",
      P.config_error("prefix-cache-affinity-filter", { explorationProbability = -0.1 }))
  end)

  it("keeps the endpoints at or above the threshold", function()
    -- aaaabbbbcccc: ep1 1/3, ep2 2/3, ep3 0
    assert.equal("ep2", kept({ affinityThreshold = 0.5, explorationProbability = 0 }, "aaaabbbbcccc"))
    assert.equal("ep1,ep2", kept({ affinityThreshold = 1 / 3, explorationProbability = 0 },
      "aaaabbbbcccc"))
    assert.equal("ep1,ep2,ep3", kept({ affinityThreshold = 0, explorationProbability = 0 },
      "aaaabbbbcccc"))
  end)

  it("keeps all when none passes, or the prompt has no block", function()
    assert.equal("ep1,ep2,ep3", kept({ affinityThreshold = 0.9, explorationProbability = 0 },
      "aaaabbbbcccc"))
    assert.equal("ep1,ep2,ep3", kept({ affinityThreshold = 0.1, explorationProbability = 0 }, "aa"))
  end)

  it("keeps all when it explores", function()
    assert.equal("ep1,ep2,ep3", kept({ affinityThreshold = 0.5, explorationProbability = 1 },
      "aaaabbbbcccc"))
  end)

  it("is skipped, with an error naming the missing prefix scorer, without one", function()
    rt = S.loaded(config({ prefixPluginName = "nope", explorationProbability = 0 }))
    S.endpoints(rt, 2)
    local _, sc, res = P.request(rt, "aaaa")
    assert.equal(200, res.status)
    assert.same({ ep1 = 0, ep2 = 0 }, sc)
    local logged = false
    for _, l in ipairs(rt:logs()) do
      logged = logged or l[2]:find('no prefix matches from "nope"', 1, true) ~= nil
    end
    assert.is_true(logged)
  end)
end)

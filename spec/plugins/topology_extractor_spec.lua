-- topology-extractor: an endpoint's host, rack, zone and region from its
-- labels (Kubernetes' by default), and the tightest level it shares with a
-- peer's.  Vectors after llm-d-router's pkg/epp/framework/plugins/
-- datalayer/extractor/topology/extractor_test.go and
-- scheduling/util/topology/level_test.go.
local K = require "plugins.kit"
local S = require "support"
local TK = require "plugins.topology_kit"

local T = "topology-extractor"

local function runtime(params)
  return TK.runtime({ plugins = { { type = T, parameters = params }, { type = "max-score-picker" } },
    schedulingProfiles = { { name = "default", plugins = { { pluginRef = "max-score-picker" } } } } })
end

local function topology(rt, name)
  return TK.call(rt, T, { names = { name } }, "return self:topology(eps[1]) or 'none'")
end

describe(T, function()
  it("reads Kubernetes' topology labels by default", function()
    local rt = S.runtime()
    assert.same({ hostname = TK.HOST, rack = TK.RACK, zone = TK.ZONE, region = TK.REGION },
      K.params(rt, T))
    rt:free()
    rt = runtime()
    assert.same({ hostname = "h1", rack = "r1", zone = "z1", region = "reg1" }, topology(rt, "peer"))
    assert.same({ rack = "r1" }, topology(rt, "rack-only"))
    rt:free()
  end)

  it("has no topology for an endpoint with none of the labels, or only empty ones", function()
    local rt = runtime()
    assert.equal("none", topology(rt, "bare"))
    assert.equal("none", topology(rt, "empty"))
    rt:free()
  end)

  it("takes other label names, and an empty name as the default", function()
    local rt = runtime({ hostname = TK.ZONE, zone = TK.HOST, rack = "" })
    assert.same({ hostname = "z1", rack = "r1", zone = "h1", region = "reg1" }, topology(rt, "peer"))
    rt:free()
  end)

  it("refuses a label name that is not a string, and an unknown parameter, at its line", function()
    assert.matches("spec.json:3: plugins[0].parameters.zone: must be a string, got 3",
      K.load_error({ '{"type": "topology-extractor", "parameters": {"zone": 3}}' }), 1, true)
    assert.matches('spec.json:3: plugins[0].parameters.node: unknown parameter "node"; known'
      .. " parameters: hostname, rack, region, zone",
      K.load_error({ '{"type": "topology-extractor", "parameters": {"node": "x"}}' }), 1, true)
  end)

  it("gives the tightest level shared with the peer: host 1 to region 4, else 5", function()
    local rt = runtime()
    local levels = TK.call(rt, T, { peer = "peer", names = { "same-host", "same-rack", "same-zone",
      "same-region", "no-match", "rack-only", "host-only", "bare", "empty" } }, [[
local peer, out = self:topology(ctx.shared[require("lupin.disagg").PEER]), {}
for i, ep in ipairs(eps) do out[i] = self:level(peer, ep) end
return out]])
    assert.same({ 1, 2, 3, 4, 5, 2, 1, 5, 5 }, levels)
    rt:free()
  end)

  it("never matches on an empty value, not even the peer's empty one", function()
    local rt = runtime()
    local levels = TK.call(rt, T, { names = { "empty", "bare", "rack-only" } }, [[
local peer, out = { hostname = "", rack = "", zone = "", region = "" }, {}
for i, ep in ipairs(eps) do out[i] = self:level(peer, ep) end
local sparse = { rack = "r1" }
out[#out + 1] = self:level(sparse, eps[3])
return out]])
    assert.same({ 5, 5, 5, 2 }, levels)
    rt:free()
  end)
end)

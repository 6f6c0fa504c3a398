-- topology-affinity-scorer: scores each candidate by the tightest level it
-- shares with the peer (the decode pick): host 1, rack 0.2, zone 0.05,
-- region 0.02, none 0; all 0 without a peer topology.  Vectors after
-- llm-d-router's pkg/epp/framework/plugins/scheduling/scorer/
-- topologyaffinity/scorer_test.go.
local K = require "plugins.kit"
local S = require "support"
local TK = require "plugins.topology_kit"

local T = "topology-affinity-scorer"
local ALL = { "same-host", "same-rack", "same-zone", "same-region", "no-match", "rack-only", "bare" }

local function runtime(params, extractor)
  return TK.runtime({ plugins = { extractor or { type = "topology-extractor" },
    { type = T, parameters = params }, { type = "max-score-picker" } },
    schedulingProfiles = { { name = "default", plugins = { { pluginRef = T },
      { pluginRef = "max-score-picker" } } } } })
end

local function scores(rt, peer, names)
  return TK.call(rt, T, { peer = peer, names = names or ALL }, "return self:score(ctx, eps)")
end

describe(T, function()
  it("scores by level: host 1, rack 0.2, zone 0.05, region 0.02, else 0 (upstream)", function()
    local rt = runtime()
    assert.same({ 1, 0.2, 0.05, 0.02, 0, 0.2, 0 }, scores(rt, "peer"))
    rt:free()
  end)

  it("scores a sparse candidate at its only level (upstream)", function()
    local rt = runtime()
    assert.same({ 0.2, 1 }, scores(rt, "peer", { "rack-only", "host-only" }))
    rt:free()
  end)

  it("scores every candidate 0 without a peer, or a peer without topology (upstream)", function()
    local rt = runtime()
    local zero = { 0, 0, 0, 0, 0, 0, 0 }
    assert.same(zero, scores(rt, nil))
    assert.same(zero, scores(rt, "bare"))
    assert.same(zero, scores(rt, "empty"))
    rt:free()
  end)

  it("reads the extractor topologyProducerName names, with its default", function()
    local rt = S.runtime()
    assert.same({ topologyProducerName = "topology-extractor" }, K.params(rt, T))
    rt:free()
    -- the region label read as the host: every reg1 candidate is on the peer's "host"
    rt = runtime({ topologyProducerName = "regions" }, { name = "regions", type = "topology-extractor",
      parameters = { hostname = TK.REGION } })
    assert.same({ 1, 1, 1, 1, 0, 0.2, 0 }, scores(rt, "peer"))
    rt:free()
  end)

  it("warns when the config has no such extractor, and then scores 0", function()
    local rt = S.loaded({ plugins = { { type = T, parameters = { topologyProducerName = "nope" } },
      { type = "max-score-picker" } } })
    local warned
    for _, l in ipairs(rt:logs()) do
      warned = warned or l[2]:find('plugins[0].parameters.topologyProducerName: plugin'
        .. ' "topology-affinity-scorer" (topology-affinity-scorer): no plugin named "nope"', 1, true)
    end
    assert.is_truthy(warned, S.json.encode(rt:logs()))
    for i, e in ipairs(TK.POOL) do
      assert(rt:upsert({ name = e[1], address = "10.0.1." .. i, port = 8000, labels = e[2] }))
    end
    assert.same({ 0, 0 }, scores(rt, "peer", { "same-host", "bare" }))
    rt:free()
  end)

  it("refuses a topologyProducerName naming another type, and other parameters", function()
    local rt = S.runtime()
    local ok, err = rt:load_string(S.json.encode({ plugins = { { type = "queue-scorer" },
      { type = T, parameters = { topologyProducerName = "queue-scorer" } } } }), "spec.json")
    rt:free()
    assert.is_nil(ok)
    assert.matches('topologyProducerName: plugin "queue-scorer" (queue-scorer) is not a'
      .. " topology-extractor", err, 1, true)
    assert.matches('spec.json:3: plugins[0].parameters.minAffinity: unknown parameter "minAffinity"',
      K.load_error({ '{"type": "topology-affinity-scorer", "parameters": {"minAffinity": "host"}}' }), 1, true)
  end)
end)

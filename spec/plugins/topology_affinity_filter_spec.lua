-- topology-affinity-filter: keeps the candidates sharing at least
-- minAffinity with the peer (the decode pick), failing open when the peer
-- has no topology or no candidate is close enough.  Vectors after
-- llm-d-router's pkg/epp/framework/plugins/scheduling/filter/
-- topologyaffinity/filter_test.go.
local K = require "plugins.kit"
local S = require "support"
local TK = require "plugins.topology_kit"

local T = "topology-affinity-filter"
local ALL = { "same-host", "same-rack", "same-zone", "same-region", "no-match", "rack-only", "bare" }

local function runtime(params, extractor)
  return TK.runtime({ plugins = { extractor or { type = "topology-extractor" },
    { type = T, parameters = params }, { type = "max-score-picker" } },
    schedulingProfiles = { { name = "default", plugins = { { pluginRef = T },
      { pluginRef = "max-score-picker" } } } } })
end

local function kept(rt, peer, names)
  return TK.call(rt, T, { peer = peer, names = names or ALL }, "return names(self:filter(ctx, eps))")
end

describe(T, function()
  it("keeps by default only the peer's host (upstream)", function()
    local rt = S.runtime()
    assert.same({ minAffinity = "host", topologyProducerName = "topology-extractor" }, K.params(rt, T))
    rt:free()
    rt = runtime()
    assert.same({ "same-host" }, kept(rt, "peer"))
    rt:free()
  end)

  it("keeps every candidate at minAffinity or tighter", function()
    for level, want in pairs({
      rack = { "same-host", "same-rack", "rack-only" },
      zone = { "same-host", "same-rack", "same-zone", "rack-only" },
      region = { "same-host", "same-rack", "same-zone", "same-region", "rack-only" },
    }) do
      local rt = runtime({ minAffinity = level })
      assert.same(want, kept(rt, "peer"), level)
      rt:free()
    end
  end)

  it("matches a sparse candidate at its only level (upstream)", function()
    local rt = runtime({ minAffinity = "rack" })
    assert.same({ "rack-only" }, kept(rt, "peer", { "rack-only" }))
    rt:free()
  end)

  it("keeps every candidate when none is close enough (upstream: fails open)", function()
    local rt = runtime()
    assert.same({ "no-match", "rack-only", "bare" }, kept(rt, "peer", { "no-match", "rack-only", "bare" }))
    rt:free()
  end)

  it("keeps every candidate when there is no peer, or it has no topology (upstream)", function()
    local rt = runtime()
    assert.same(ALL, kept(rt, nil))
    assert.same(ALL, kept(rt, "bare"))
    assert.same(ALL, kept(rt, "empty"))
    rt:free()
  end)

  it("drops a candidate without topology when another matches (upstream)", function()
    local rt = runtime()
    assert.same({ "same-host" }, kept(rt, "peer", { "bare", "same-host", "empty" }))
    rt:free()
  end)

  it("refuses a minAffinity that is no level, at its line (upstream)", function()
    assert.matches('spec.json:3: plugins[0].parameters.minAffinity: must be one of "host", "rack",'
      .. ' "zone", "region", got "datacenter"',
      K.load_error({ '{"type": "topology-affinity-filter", "parameters": {"minAffinity": "datacenter"}}' }),
      1, true)
  end)

  it("reads the extractor topologyProducerName names", function()
    -- an extractor reading the zone label as the host: "same-zone" is on the peer's "host"
    local rt = runtime({ topologyProducerName = "zones" }, { name = "zones", type = "topology-extractor",
      parameters = { hostname = TK.ZONE } })
    assert.same({ "same-host", "same-rack", "same-zone" }, kept(rt, "peer"))
    rt:free()
  end)

  it("warns when the config has no such extractor, and then keeps everything", function()
    local rt = S.loaded({ plugins = { { type = T }, { type = "max-score-picker" } } })
    local warned
    for _, l in ipairs(rt:logs()) do
      warned = warned or l[2]:find('spec.json:1: plugins[0].parameters.topologyProducerName: plugin'
        .. ' "topology-affinity-filter" (topology-affinity-filter): no plugin named'
        .. ' "topology-extractor": without topology-extractor no endpoint has a topology, so this'
        .. " plugin does nothing; add a topology-extractor", 1, true)
    end
    assert.is_truthy(warned, S.json.encode(rt:logs()))
    for i, e in ipairs(TK.POOL) do
      assert(rt:upsert({ name = e[1], address = "10.0.1." .. i, port = 8000, labels = e[2] }))
    end
    assert.same(ALL, kept(rt, "peer"))
    rt:free()
  end)

  it("refuses a topologyProducerName naming another type", function()
    local rt = S.runtime()
    local ok, err = rt:load_string(S.json.encode({ plugins = { { type = "queue-scorer" },
      { type = T, parameters = { topologyProducerName = "queue-scorer" } } } }), "spec.json")
    rt:free()
    assert.is_nil(ok)
    assert.matches('topologyProducerName: plugin "queue-scorer" (queue-scorer) is not a'
      .. " topology-extractor", err, 1, true)
  end)
end)

describe(T .. " in a P/D config", function()
  -- decode endpoints d1 (host h1) and d2 (host h2); prefill endpoints p1 (h1),
  -- p2 (h2), p3 (h2, rack r2); the decode picks d1 by queue, prefill must
  -- follow it to h1 although its queue scorer prefers p2.
  local function endpoints(rt)
    local function ep(name, role, host, rack, queue)
      local n = tonumber(name:sub(2)) + (role == "prefill" and 10 or 0)
      assert(rt:upsert({ name = name, address = "10.0.2." .. n, port = 8000,
        labels = { ["llm-d.ai/role"] = role, [TK.HOST] = host, [TK.RACK] = rack } }))
      rt:set_metrics(name, { waiting_queue_size = queue })
    end
    ep("d1", "decode", "h1", "r1", 0)
    ep("d2", "decode", "h2", "r2", 9)
    ep("p1", "prefill", "h1", "r1", 9)
    ep("p2", "prefill", "h2", "r2", 0)
    ep("p3", "prefill", "h3", "r1", 5)
  end

  local function config(min)
    return { plugins = { { type = "topology-extractor" }, { type = T, parameters = { minAffinity = min } },
      { type = "prefill-filter" }, { type = "decode-filter" }, { type = "queue-scorer" },
      { type = "max-score-picker" }, { type = "always-disagg-pd-decider" },
      { type = "disagg-profile-handler", parameters = { deciders = { prefill = "always-disagg-pd-decider" } } } },
      schedulingProfiles = {
        { name = "decode", plugins = { { pluginRef = "decode-filter" }, { pluginRef = "queue-scorer" },
          { pluginRef = "max-score-picker" } } },
        { name = "prefill", plugins = { { pluginRef = "prefill-filter" }, { pluginRef = T },
          { pluginRef = "queue-scorer" }, { pluginRef = "max-score-picker" } } } } }
  end

  it("sends the prefill to the decode pick's host, or its rack", function()
    for min, want in pairs({ host = "10.0.2.11:8000", rack = "10.0.2.13:8000" }) do -- p1, p3
      local rt = S.loaded(config(min))
      endpoints(rt)
      local picks, res = K.picks(rt)
      assert.same({ "d1" }, picks)
      assert.equal(want, res.headers["x-prefiller-host-port"], min)
      rt:free()
    end
    -- without the filter, the queue scorer alone sends it to p2 on another host
    local c = config("host")
    table.remove(c.schedulingProfiles[2].plugins, 2)
    local rt = S.loaded(c)
    endpoints(rt)
    local _, res = K.picks(rt)
    assert.equal("10.0.2.12:8000", res.headers["x-prefiller-host-port"])
    rt:free()
  end)
end)

local K = require "plugins.kit"
local S = require "support"

local T = "header-based-testing-filter"
local H = "test-epp-endpoint-selection"

local function kept(rt, value, names)
  return K.call(rt, { type = T, point = "filter", names = names,
    headers = value and { [H] = value } or {} }).kept
end

describe(T, function()
  it("keeps the endpoints the header names, by IP, ip:port or name, in the header's order",
    function()
    local rt = K.pool(4)
    assert.same({ "ep3" }, kept(rt, "10.0.0.3"))
    assert.same({ "ep4", "ep1" }, kept(rt, "10.0.0.4:8000, 10.0.0.1"))
    assert.same({ "ep2", "ep3" }, kept(rt, " ep2 ,ep3,ep2"))
  end)

  it("keeps every port on a named IP, and no port that does not match", function()
    local rt = S.runtime()
    assert(rt:upsert({ name = "a", address = "10.0.0.9", port = 8000 }))
    assert(rt:upsert({ name = "b", address = "10.0.0.9", port = 8001 }))
    assert.same({ "a", "b" }, kept(rt, "10.0.0.9"))
    assert.same({ "b" }, kept(rt, "10.0.0.9:8001"))
    assert.same({}, kept(rt, "10.0.0.9:9999"))
  end)

  -- llm-d-router pkg/epp/framework/plugins/scheduling/test/filter/filter_test.go,
  -- TestFilter "IPv6 with brackets and port", "IPv6 bare address (no port)" and
  -- "multiple header values (IP and IP:port) ... in order and deduped"
  it("matches IPv6 endpoints bracketed with a port, or bare", function()
    local rt = S.runtime()
    assert(rt:upsert({ name = "a", address = "fd00::1", port = 3002 }))
    assert(rt:upsert({ name = "b", address = "fd00::2", port = 3004 }))
    assert.same({ "a" }, kept(rt, "[fd00::1]:3002"))
    assert.same({ "b" }, kept(rt, "fd00::2"))
    assert.same({}, kept(rt, "[fd00::1]:3004"))
    rt = S.runtime()
    assert(rt:upsert({ name = "x1", address = "10.0.0.1", port = 3000 }))
    assert(rt:upsert({ name = "x2", address = "10.0.0.2", port = 3002 }))
    assert(rt:upsert({ name = "x3", address = "10.0.0.3", port = 3004 }))
    assert.same({ "x3", "x2" }, kept(rt, "10.0.0.3:3004, 10.0.0.2, 10.0.0.3"))
  end)

  it("keeps nothing without the header, with an empty one, or among no candidates", function()
    local rt = K.pool(2)
    assert.same({}, kept(rt, nil))
    assert.same({}, kept(rt, ""))
    assert.same({}, kept(rt, " , "))
    assert.same({}, kept(rt, "10.0.0.1", {}))
    assert.same({}, kept(rt, "10.0.0.7"))
  end)

  it("takes no parameters", function()
    local err = K.load_error({ '{"type": "header-based-testing-filter", "parameters": {"h": 1}}' })
    assert.matches("^spec%.json:3: plugins%[0%]%.parameters%.h: unknown parameter", err)
  end)

  it("routes end to end; no header is a 503 naming the filter", function()
    local rt = S.loaded(K.config({ { type = T } }, { { pluginRef = T } }))
    S.endpoints(rt, 3)
    local names = K.picks(rt, { path = "/v1/completions", body = "{}",
      headers = { ["Test-EPP-Endpoint-Selection"] = "10.0.0.2" } })
    assert.same({ "ep2" }, names)
    local _, res = K.picks(rt)
    assert.equal(503, res.status)
    assert.equal(T, res.plugin)
  end)
end)

-- GIE's conformance plugin (pkg/epp/framework/plugins/requestcontrol/test/
-- responsereceived/destination_endpoint_served_verifier.go): the served
-- endpoint the data plane reports, echoed to the client.
local K = require "plugins.kit"
local P = require "e2e.procs"
local S = require "support"

local T = "destination-endpoint-served-verifier"

describe(T, function()
  it("echoes the served endpoint in x-conformance-test-served-endpoint", function()
    local rt = K.pool(2)
    local out = K.call(rt, { type = T, point = "response_header", result = { "ep1" },
      response = { ["x-gateway-destination-endpoint-served"] = "10.0.0.2:8000" } })
    assert.same({ ["x-conformance-test-served-endpoint"] = "10.0.0.2:8000" }, out.response_headers)
  end)

  it("says what is missing when the data plane reported no served endpoint", function()
    local rt = K.pool(1)
    local out = K.call(rt, { type = T, point = "response_header", result = { "ep1" } })
    assert.same({ ["x-conformance-test-served-endpoint"] =
      "fail: missing destination endpoint served metadata" }, out.response_headers)
  end)

  it("takes no parameters", function()
    local rt = S.runtime()
    finally(function() rt:free() end)
    local ok, err = rt:load_string(S.json.encode({ plugins = { { type = T,
      parameters = { expected = "x" } } } }), "cfg.json")
    assert.is_nil(ok)
    assert.matches('unknown parameter "expected"', err)
  end)

  it("through lupin serve, names the endpoint that answered", function()
    local sim = P.sim("--model m --instant", 2)
    local gw
    finally(function()
      P.stop(gw)
      P.stop(sim)
    end)
    gw = P.gateway({
      plugins = { { type = T, name = "verify" }, { type = "random-picker" } },
      schedulingProfiles = { { name = "default", plugins = { { pluginRef = "random-picker" } } } },
      endpoints = { { name = "e1", address = "127.0.0.1", port = sim.ports[1] },
        { name = "e2", address = "127.0.0.1", port = sim.ports[2] } },
    })
    for _ = 1, 4 do
      local status, h = P.post(gw.base, "/v1/completions", { model = "m", prompt = "hi",
        max_tokens = 2 })
      assert.equal(200, status)
      assert.truthy(h["x-sim-endpoint"])
      assert.equal(h["x-sim-endpoint"], h["x-conformance-test-served-endpoint"])
    end
  end)
end)

local S = require "support"
local P = require "prefix_support"

-- Two profiles over the same endpoints, run by pd-profile-handler.
local function config(params, handler)
  handler = handler or {}
  handler.threshold = handler.threshold or 1 -- prefill for any uncached prompt
  local function profile(name)
    return { name = name, plugins = { { pluginRef = "spec-scores-picker" } } }
  end
  return {
    plugins = { { type = "pd-profile-handler", parameters = handler },
      { type = "prefill-header-handler", parameters = params }, { type = "spec-scores-picker" } },
    schedulingProfiles = { profile("decode"), profile("prefill"), profile("p2") },
  }
end

describe("prefill-header-handler", function()
  local rt
  after_each(function()
    if rt then
      rt:free()
      rt = nil
    end
  end)

  it("defaults to the profile prefill and refuses a non-string", function()
    assert.same({ prefillProfile = "prefill" }, P.defaults("prefill-header-handler"))
    local r = S.runtime()
    local ok, err = r:load_string(S.json.encode(config({ prefillProfile = false })), "spec.json")
    r:free()
    assert.is_nil(ok)
    assert.matches("parameters.prefillProfile: must be a string, got false", err)
  end)

  it("sets x-prefiller-host-port to the prefill profile's endpoint", function()
    rt = S.loaded(config())
    S.endpoints(rt, 2)
    local _, _, res = P.request(rt, "hello")
    assert.equal("10.0.0.1:8000", res.headers["x-prefiller-host-port"])
  end)

  it("reads the profile named prefillProfile", function()
    rt = S.loaded(config({ prefillProfile = "p2" }, { prefillProfile = "p2" }))
    S.endpoints(rt, 2)
    local _, _, res = P.request(rt, "hello")
    assert.equal("10.0.0.1:8000", res.headers["x-prefiller-host-port"])
  end)

  it("sets nothing when the prefill profile did not run", function()
    rt = S.loaded(config({ prefillProfile = "p2" }))
    S.endpoints(rt, 2)
    local _, _, res = P.request(rt, "hello")
    assert.equal(200, res.status)
    assert.is_nil(res.headers["x-prefiller-host-port"])
  end)
end)

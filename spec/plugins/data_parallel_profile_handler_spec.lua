-- data-parallel-profile-handler.  Vectors from llm-d/llm-d-router
-- pkg/epp/framework/plugins/scheduling/profilehandler/dataparallel/dp_profile_handler_test.go
-- (named per test below).
local S = require "support"
local P = require "prefix_support"

local function config(params, profiles)
  local list = {}
  for i, name in ipairs(profiles or { "dp" }) do
    list[i] = { name = name, plugins = { { pluginRef = "spec-scores-picker" } } }
  end
  return { plugins = { { type = "data-parallel-profile-handler", parameters = params },
    { type = "spec-scores-picker" } }, schedulingProfiles = list }
end

local function load_error(params)
  local rt = S.runtime()
  local ok, err = rt:load_string(S.json.encode(config(params)), "spec.json")
  rt:free()
  assert.is_nil(ok)
  return err
end

describe("data-parallel-profile-handler", function()
  -- TestProfileHandlerFactory: default 8000, 1 and 65535 valid, -1 and 65536
  -- refused; TestProfileHandlerFactoryInvalidJSON: a string or boolean port
  it("defaults primaryPort to 8000 and refuses ports out of range or not integers", function()
    assert.same({ primaryPort = 8000 }, P.defaults("data-parallel-profile-handler"))
    assert.matches("parameters.primaryPort: must be an integer between 0 and 65535, got %-1",
      load_error({ primaryPort = -1 }))
    assert.matches("parameters.primaryPort: must be an integer between 0 and 65535, got 65536",
      load_error({ primaryPort = 65536 }))
    assert.matches("parameters.primaryPort: must be an integer", load_error({ primaryPort = "8000" }))
    assert.matches("parameters.primaryPort: must be an integer", load_error({ primaryPort = true }))
    for _, port in ipairs({ 1, 65535 }) do
      local rt = S.loaded(config({ primaryPort = port }))
      rt:free()
    end
  end)

  -- Test_ProfileHandler_ProcessResults "success: single profile with
  -- primaryPort → port overridden, header set"
  it("sends the pick to primaryPort of its address and names the rank", function()
    local rt = S.loaded(config({ primaryPort = 9000 }))
    S.endpoints(rt, 2)
    local pick, _, res = P.request(rt, "hello", { profile = "dp" })
    rt:free()
    assert.equal(200, res.status)
    assert.equal("ep1", pick)
    assert.equal("10.0.0.1", res.picks[1].address)
    assert.equal(9000, res.picks[1].port)
    assert.equal("10.0.0.1:8000", res.headers["x-data-parallel-host-port"])
  end)

  -- "success: primaryPort=0 → port becomes '0'": lupin keeps the rank's port
  it("keeps the rank's own port with primaryPort 0", function()
    local rt = S.loaded(config({ primaryPort = 0 }))
    S.endpoints(rt, 1)
    local _, _, res = P.request(rt, "hello")
    rt:free()
    assert.equal(8000, res.picks[1].port)
    assert.equal("10.0.0.1:8000", res.headers["x-data-parallel-host-port"])
  end)

  -- Test_ProfileHandler_Pick "error: multiple profiles configured in EPP"
  it("fails requests clearly with more than one profile", function()
    local rt = S.loaded(config(nil, { "a", "b" }))
    S.endpoints(rt, 1)
    local _, _, res = P.request(rt, "hello")
    rt:free()
    assert.equal(500, res.status)
    assert.matches("needs exactly one scheduling profile, the config has 2", res.message)
  end)

  -- "error: single profile but result is nil": the profile's own failure
  it("fails with the profile's reason when it finds no endpoint", function()
    local rt = S.loaded(config())
    local _, _, res = P.request(rt, "hello")
    rt:free()
    assert.equal(503, res.status)
    assert.is_nil(res.headers["x-data-parallel-host-port"])
  end)
end)

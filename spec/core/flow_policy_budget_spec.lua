-- Flow-control policies are plugin calls like any other: a saturation
-- detector that never returns is cut by its budget, and the request goes on
-- as if the detector had failed (not saturated).
local S = require "support"

local dir
setup(function()
  dir = S.tmpdir()
  S.write(dir .. "/spin-detector.lua", [[
return { type = "spin-detector", saturated = function() while true do end end }
]])
end)

local function config(detector)
  return {
    plugins = { { type = "queue-scorer" }, { type = "max-score-picker" }, { type = detector } },
    schedulingProfiles = { { name = "default", plugins = {
      { pluginRef = "queue-scorer" }, { pluginRef = "max-score-picker" } } } },
    saturationDetector = { pluginRef = detector },
    flowControl = {},
  }
end

describe("a flow-control policy that never returns", function()
  it("is cut: the detector counts as not saturated and the request is scheduled", function()
    local rt = S.loaded(config("spin-detector"), { plugin_dirs = { S.FIXTURES, dir } })
    finally(function() rt:free() end)
    S.endpoints(rt, 2)
    rt:set_dispatch(function() end) -- a host that can queue: flow control is on
    for _ = 1, 3 do
      assert.equal(200, S.lifecycle(rt).status)
    end
  end)
end)

-- The example custom plugin: 1 / (1 + waiting + runningWeight · running).
local S = require "support"

describe("least-loaded-scorer (example plugin)", function()
  local function scores(params, metrics)
    local rt = S.runtime({ plugin_dirs = { S.ROOT .. "/examples/plugins", S.FIXTURES } })
    assert(rt:load_string(S.json.encode({
      plugins = { { type = "least-loaded-scorer", name = "l", parameters = params },
        { type = "test-picker", name = "p" } },
      schedulingProfiles = { { name = "d", plugins = { { pluginRef = "l" }, { pluginRef = "p" } } } },
    })))
    S.endpoints(rt, #metrics, metrics)
    S.lifecycle(rt)
    local out = S.eval(rt, [[return require("lupin.runtime").current.by_name.p.obj.last_scores]])
    rt:free()
    return out
  end

  it("scores by waiting plus running requests", function()
    assert.same({ 1, 0.5, 0.25 }, scores(nil, { {}, { waiting_queue_size = 1 },
      { waiting_queue_size = 1, running_requests = 2 } }))
  end)

  it("weighs running requests by runningWeight", function()
    assert.same({ 1, 0.5 }, scores({ runningWeight = 0 }, { {}, { running_requests = 5,
      waiting_queue_size = 1 } }))
  end)

  it("refuses a negative runningWeight", function()
    local rt = S.runtime({ plugin_dirs = { S.ROOT .. "/examples/plugins" } })
    local ok, err = rt:load_string('{"plugins":[{"type":"least-loaded-scorer",'
      .. '"parameters":{"runningWeight":-1}}]}', "c.json")
    assert.is_nil(ok)
    assert.matches("plugins[0].parameters.runningWeight: must be a number ≥ 0, got -1", err, 1, true)
    rt:free()
  end)
end)

-- The example custom plugin: 1 / (1 + waiting + runningWeight · running),
-- tested as an author would, with lupin.testing.
local testing = require "lupin.testing"

local FILE = (os.getenv("PWD") or ".") .. "/examples/plugins/least-loaded-scorer.lua"

describe("least-loaded-scorer (example plugin)", function()
  local function scores(params, metrics)
    local t = testing.new { plugins = FILE, config = { plugins = {
      { type = "least-loaded-scorer", name = "l", parameters = params } } } }
    t:endpoints(metrics)
    local out = t:call("l", "score")
    t:free()
    assert.is_true(out.ok, out.error)
    return out.scores
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
    local ok, err = pcall(testing.new, { plugins = FILE, config = { plugins = {
      { type = "least-loaded-scorer", parameters = { runningWeight = -1 } } } } })
    assert.is_false(ok)
    assert.matches("plugins[0].parameters.runningWeight: must be a number ≥ 0, got -1", err, 1, true)
  end)
end)

-- The C embedding example: built by make, run for real.
local S = require "support"

describe("examples/embed", function()
  it("schedules 1,000 requests over 16 endpoints, levelling the queues", function()
    local out = S.program("embed", "examples/embed/config.json")
    assert.matches("rc=0", out, 1, true)
    assert.matches("1000 requests, 0 failed, 0 live", out, 1, true)
    for i = 1, 16 do
      assert.matches(("ep%-3d %4d picks"):format(i, 70 - (i - 1)), out, 1, true)
    end
    assert.matches("picks match the least-loaded expectation", out, 1, true)
  end)

  it("fails with the config error when the config is broken", function()
    local out = S.program("embed", "/nonexistent.json")
    assert.matches("embed: cannot read config /nonexistent.json", out, 1, true)
    assert.matches("rc=1", out, 1, true)
  end)
end)

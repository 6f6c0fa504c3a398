-- The C embedding example: built by make, run for real.
local S = require "support"

describe("examples/embed", function()
  it("schedules 1,000 requests over 16 endpoints, levelling the queues", function()
    local p = io.popen("LUPIN_HOME=. " .. S.BUILD .. "/embed examples/embed/config.json 2>&1; echo rc=$?")
    local out = p:read("*a")
    p:close()
    assert.matches("rc=0", out, 1, true)
    assert.matches("1000 requests, 0 failed, 0 live", out, 1, true)
    for i = 1, 16 do
      assert.matches(("ep%-3d %4d picks"):format(i, 70 - (i - 1)), out, 1, true)
    end
    assert.matches("picks match the least-loaded expectation", out, 1, true)
  end)

  it("fails with the config error when the config is broken", function()
    local p = io.popen("LUPIN_HOME=. " .. S.BUILD .. "/embed /nonexistent.json 2>&1; echo rc=$?")
    local out = p:read("*a")
    p:close()
    assert.matches("embed: cannot read config /nonexistent.json", out, 1, true)
    assert.matches("rc=1", out, 1, true)
  end)
end)

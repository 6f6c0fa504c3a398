-- The process harness itself (spec/e2e/procs.lua): specs take "p.rc
-- exists" for "the process exited, with its status in it".  Written with
-- `echo $? > rc`, the file existed empty for a moment first: a spec polling
-- then read no status and reported a process that had exited as still
-- running (hostile_start_spec, once, on a loaded machine).
local P = require "e2e.procs"

describe("the spec process harness", function()
  it("shows an exit status file only with the status in it", function()
    for _ = 1, 10 do
      local p = P.start("sh -c 'sleep 0.05; exit 3'")
      -- polled without a pause, to land in any window there is
      local s
      repeat
        s = P.read(p.rc)
      until s
      assert.equal("3", s:match("%d+"), "an exit status file without the status: " .. ("%q"):format(s))
      assert.equal(3, P.wait(p))
    end
  end)
end)

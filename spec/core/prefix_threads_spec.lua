-- Threads on one lupin_shared: the C program spec/core/prefix_threads.c (built
-- by make) runs 4 threads, each with its own runtime, recording, matching and
-- purging on one keyed prefix index and incrementing one shared dict.
local S = require "support"

describe("one keyed prefix index and one dict under 4 threads", function()
  it("loses no increment and answers every match whole", function()
    local out = S.program("prefix-threads", "10000")
    assert.matches("ok 4 threads x 10000 iterations: total 40000", out, 1, true)
    assert.matches("ok no lost increments, matches consistent", out, 1, true)
    assert.matches("rc=0", out, 1, true)
  end)
end)

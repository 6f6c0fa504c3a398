-- Threads on one lupin_shared: the C program spec/core/prefix_threads.c (built
-- by make) runs 4 threads, each with its own runtime, recording, matching,
-- purging and removing on one keyed prefix index, incrementing one shared
-- dict and using the token cache, and a fifth with no runtime applying,
-- removing and purging by endpoint name (a host's KV-event thread).
local S = require "support"

describe("one keyed prefix index, one dict and the token cache under 5 threads", function()
  it("loses no increment and answers every match whole", function()
    local out = S.program("prefix-threads", "10000")
    assert.matches("ok 4 threads x 10000 iterations: total 40000", out, 1, true)
    assert.matches("ok no lost increments, matches consistent", out, 1, true)
    assert.matches("ok tokens: %d+ entries, [1-9]%d* hits", out)
    assert.matches("rc=0", out, 1, true)
  end)
end)
